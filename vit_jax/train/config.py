"""The training config: every key with its default, validation, and durations resolved to steps in one place.

Config files in configs/ start from `default_config()` and change what they need; `validate()` then rejects any key
that is not in the schema (naming the closest valid key) and any value of the wrong type, so a typo can never be
silently ignored. Durations may be given in steps, epochs or examples; `resolve_durations` turns them into steps.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from typing import Any

import ml_collections

from vit_jax.errors import ConfigError  # defined with the other user errors; its users import it from here too
from vit_jax.data.repeated import check_repeats
from vit_jax.models import build as models  # the model-family registry, with the built-in families registered
from vit_jax.train import objectives


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = models.schema()  # every registered model family's keys, with their defaults (models/family.py)
    c.data = dict(
        name="digits",  # digits | digits_mosaic | imagenet21k[/fall11|/winter21] | folder:/path | any TFDS name
        data_dir="",  # '' = $TFDS_DATA_DIR or ~/tensorflow_datasets
        manual_dir="",
        train_split="train", eval_split="test",
        pp_train="decode|resize(224)|flip_lr|value_range(-1,1)",  # big_vision-style op string
        pp_eval="decode|resize(224)|value_range(-1,1)",
        pp_modules=(),  # extra op modules to import (dotted names), whose @register ops the op strings may use
        fraction=1.0,  # use this fraction of the training split (data-size sweeps)
        repeated_augmentation=1,  # k > 1: each image k times per global batch, each copy augmented anew (DeiT: 3)
        num_workers=0,  # decode threads per process; 0 = automatic
        prefetch=2,  # batches in flight per process
        # A data_dir in a bucket (gs://) is streamed: each process reads its own files, shuffled in windows of
        # this many records (disk: about 1 + stream_read_ahead windows of records per process; docs/data.md).
        stream_window=20_000,
        stream_read_ahead=1,  # windows fetched ahead of the one being read
    )
    c.batch_size = 4096  # global
    c.micro_batches = 1  # gradient accumulation: the batch is processed in this many slices per update
    # Training length: exactly one of these (steps, epochs of the training split, or examples).
    c.total_steps = 0
    c.total_epochs = 0.0
    c.total_examples = 0
    c.optimizer = dict(
        name="adamw",  # adamw | sgd | adafactor | lamb
        lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, momentum=0.9, nesterov=False,
        weight_decay=0.0,  # decoupled; multiplied by the lr schedule (optax convention)
        decay_mask="kernels",  # kernels | all | none: which parameters are decayed
        grad_clip_norm=1.0,  # 0 disables
        mu_dtype="float32",  # bfloat16 halves first-moment memory
        schedule="cosine",  # cosine | linear | rsqrt | staircase | constant (after warmup)
        warmup_steps=0, warmup_epochs=0.0, warmup_examples=0,
        end_lr_factor=0.0,  # lr at the end of linear/cosine decay, as a fraction of lr
        rsqrt_timescale=10_000,
        # staircase: lr *= staircase_factor at these fractions of the total steps (BiT: 30/90, 60/90, 80/90 epochs)
        staircase_at=(), staircase_factor=0.1,
        # Layer-wise lr decay (BEiT / MAE fine-tuning; train/layer_decay.py): block i of L learns at
        # decay^(L - i) x lr, the embeddings at decay^(L + 1), the head at lr. 0 or 1: off.
        layer_decay=0.0,
    )
    c.loss = dict(
        kind="softmax_xent",  # softmax_xent | sigmoid_xent
        label_smoothing=0.0,
        mixup_alpha=0.0,  # > 0: mixup on device with lambda ~ Beta(alpha, alpha)
        cutmix_alpha=0.0,  # > 0: CutMix (data/mixup.py), switched per batch with mixup when both are on (DeiT)
        cutmix_switch_prob=0.5,  # with both on: the probability of CutMix for a batch
        # > 0 (sigmoid_xent only): binary targets, 1 where a class's smoothed, mixed weight exceeds it (timm's
        # BinaryCrossEntropy target_threshold; DeiT III trains with BCE)
        bce_target_threshold=0.0,
    )
    # What the run learns (train/objectives/: classification, mae, masked_patch_prediction, segmentation, or any
    # registered objective); each objective's own settings are a group of their own (mae.*, mpp.*, ...), with the
    # defaults its module gives. Evaluate a run with its objective's evaluator (eval.evaluators).
    c.objective = objectives.DEFAULT_OBJECTIVE
    for cls in objectives.OBJECTIVES.values():
        if cls.settings:
            c[cls.settings] = cls.settings_defaults()
    c.mesh = dict(data=-1, fsdp=1, tensor=1)  # -1: all remaining devices
    c.checkpoint = dict(
        every_steps=0, every_epochs=0.0,  # 0 and 0.0: only at the end (and on preemption)
        keep=3,  # the last N
        keep_every_steps=0,  # and every K-th step forever (0: none)
        async_save=True,
    )
    c.eval = dict(
        # Evaluators run during training, by name (train/hooks.py EVALUATORS; big_vision's `evals`): classification
        # on data.eval_split, and few-shot linear probes (which run when eval.fewshot.datasets names datasets).
        evaluators=(objectives.objective_class(objectives.DEFAULT_OBJECTIVE).evaluator, "fewshot"),
        every_steps=0, every_epochs=0.0,  # 0 and 0.0: only at the end
        batch_size=0,  # 0: the training batch size
        fewshot=dict(
            datasets=(),  # dataset names evaluated with closed-form few-shot ridge regression
            # test_split "": each dataset's labelled held-out split (test; validation where there is no test,
            # and for imagenet2012, whose TFDS test split is unlabelled).
            train_split="train", test_split="",
            shots=(1, 5, 10, 25), l2_reg=1e-2, seeds=3, every_steps=0, every_epochs=0.0,
            # Features of only the first N examples of each split (0: all): the shots are drawn from the first
            # max_train_examples (TFDS splits are stored shuffled), so ImageNet few-shot need not embed 1.28M images.
            max_train_examples=0, max_test_examples=10_000,
            # Weighted k-NN (eval/knn.py; DINO's k = 10, 20 at temperature 0.07) on the same features; () none.
            knn=(), knn_temperature=0.07,
        ),
    )
    c.log_every_steps = 50
    c.init = dict(
        checkpoint="",  # .npz (official/big_vision), timm .safetensors, or one of our run dirs
        required=False,  # True (fine-tuning configs): starting without init.checkpoint is an error, not random init
        reinit=("head",),  # parameters that keep their fresh init when fine-tuning
        posemb_resize="bicubic",  # bicubic | bilinear | dinov2 (DINOv2's offset bicubic)
    )
    # Steps whose loss, gradients, update or new parameters are not finite are skipped (the state is kept); after
    # max_consecutive such steps in a row the run stops, saving the last good state. loss_spike_factor > 0 also
    # skips a step whose loss exceeds that many times the running average of the accepted losses.
    c.nan_guard = dict(max_consecutive=10, loss_spike_factor=0.0)
    # decay > 0: keep an exponential moving average of the weights (train/ema.py; DeiT: 0.99996), which the run's
    # evaluators read and `vit-jax eval` / `predict` load as the run's weights. 0: none.
    c.ema = dict(decay=0.0)
    c.distributed = dict(
        coordinator="",  # host:port; '' = auto-detect (TPU pod, SLURM) or single process
        num_processes=0, process_id=-1,
        heartbeat_timeout_s=30,  # a dead peer is detected within about this long
        initialization_timeout_s=300,
    )
    c.num_cpu_devices = 0  # > 0: simulate this many CPU devices (development / tests)
    # A multi-stage run (train/stages.py): ((name, {dotted key: value}), ...), each stage this config with its
    # overrides, trained in order in WORKDIR/name ('{workdir}' in a string value: this run's workdir, so that
    # init.checkpoint='{workdir}/pretrain' starts from an earlier stage). Empty: one run.
    c.stages = ()
    # Results copied into WORKDIR/summary.json: ((key, 'STAGE:METRIC'), ...), a stage's final metric each.
    c.stage_results = ()
    return c


# ---------------------------------------------------------------------------------------------------------------------
# Validation.

def _flat(c: Any, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in c.items():
        if isinstance(v, (ml_collections.ConfigDict, dict)):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _type_ok(default: Any, value: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, (tuple, list)):
        return isinstance(value, (tuple, list))
    return True


def unknown_key_message(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    leaf = key.rsplit(".", 1)[-1]
    close = close or [k for k in valid if k.rsplit(".", 1)[-1] == leaf][:1]
    return f"unknown config key '{key}'" + (f"; did you mean '{close[0]}'?" if close else "")


def check_override_keys(argv: list[str]) -> None:
    """Unknown `--config.a.b=...` keys fail with the closest valid key (before absl's own, vaguer error)."""
    valid = list(_flat(default_config()))
    for arg in argv:
        m = re.match(r"--config\.([\w.]+)(?:=|$)", arg)
        if m and m.group(1) not in valid and not any(v.startswith(m.group(1) + ".") for v in valid):
            raise ConfigError(unknown_key_message(m.group(1), valid))


def validate(config: ml_collections.ConfigDict) -> None:
    """Every key must exist in the schema with a value of the schema's type (ints accepted for floats)."""
    schema = _flat(default_config())
    given = _flat(config)
    for key, value in given.items():
        if key not in schema:
            raise ConfigError(unknown_key_message(key, list(schema)))
        default = schema[key]
        if not _type_ok(default, value):
            raise ConfigError(f"config key '{key}' must be {type(default).__name__}, got {value!r} "
                              f"({type(value).__name__})")
    lengths = [k for k in ("total_steps", "total_epochs", "total_examples") if given.get(k)]
    if len(lengths) != 1:
        raise ConfigError("set exactly one of total_steps, total_epochs, total_examples "
                          f"(got {', '.join(lengths) or 'none'})")
    for group in ("optimizer.warmup", "checkpoint.every", "eval.every", "eval.fewshot.every"):
        set_ = [k for k in given if k.startswith(group + "_") and given[k]]
        if len(set_) > 1:
            raise ConfigError(f"set only one of {', '.join(set_)}")
    check_repeats(config.data.repeated_augmentation, config.batch_size)
    fs = config.eval.fewshot
    if any(int(k) < 1 for k in fs.knn) or fs.knn_temperature <= 0:
        raise ConfigError(f"eval.fewshot.knn={tuple(fs.knn)}, knn_temperature={fs.knn_temperature}: give neighbour "
                          "counts >= 1 and a positive temperature, e.g. (10, 20) and 0.07")
    if config.batch_size % config.micro_batches:
        raise ConfigError(f"batch_size {config.batch_size} is not divisible by micro_batches {config.micro_batches}")
    choices = {"optimizer.name": ("adamw", "sgd", "adafactor", "lamb"),
               "optimizer.schedule": ("cosine", "linear", "rsqrt", "staircase", "constant"),
               "optimizer.decay_mask": ("kernels", "all", "none"),
               "loss.kind": ("softmax_xent", "sigmoid_xent"), "optimizer.mu_dtype": ("float32", "bfloat16"),
               "init.posemb_resize": ("bicubic", "bilinear", "dinov2"), "objective": tuple(objectives.OBJECTIVES)}
    for key, allowed in choices.items():
        if given[key] not in allowed:
            raise ConfigError(f"config key '{key}' is {given[key]!r}; choose one of {', '.join(allowed)}")
    at = list(config.optimizer.staircase_at)
    if config.optimizer.schedule == "staircase" and (not at or at != sorted(at) or not all(0 < f < 1 for f in at)):
        raise ConfigError(f"optimizer.staircase_at={tuple(at)}: the staircase schedule needs increasing fractions of "
                          "the training steps in (0, 1), e.g. (0.3, 0.6, 0.9)")
    if not 0.0 <= config.ema.decay < 1.0:
        raise ConfigError(f"ema.decay={config.ema.decay}: give the EMA's decay per step in [0, 1), e.g. 0.9999 "
                          "(DeiT: 0.99996; 0 = no EMA)")
    if not 0.0 <= config.optimizer.layer_decay <= 1.0:
        raise ConfigError(f"optimizer.layer_decay={config.optimizer.layer_decay}: give a factor in (0, 1), e.g. 0.75 "
                          "(0 or 1: off)")
    _check_objective(config)


def _check_objective(config: ml_collections.ConfigDict) -> None:
    """What every objective's settings must satisfy (train/objectives/base.py), then the objective's own checks."""
    objective = objectives.objective_class(config.objective)
    owners = objectives.evaluator_objectives()  # "fewshot" and other generic evaluators suit every objective
    wrong = [e for e in config.eval.evaluators if owners.get(e, config.objective) != config.objective]
    if wrong:
        raise ConfigError(f"eval.evaluators {tuple(wrong)} do not evaluate objective '{config.objective}'; use "
                          f'eval.evaluators=("{objective.evaluator}", "fewshot")')
    if objective.pretraining and config.init.checkpoint:
        raise ConfigError(f"objective='{config.objective}' pretrains from scratch (its pretraining head is in no "
                          "checkpoint): leave init.checkpoint empty; fine-tune from the run with "
                          "objective='classification'")
    if objective.pretraining and 0.0 < config.optimizer.layer_decay < 1.0:
        raise ConfigError(f"optimizer.layer_decay is for fine-tuning ({config.objective} pretrains every layer at "
                          "one lr): set optimizer.layer_decay=0")
    if config.loss.bce_target_threshold and (config.loss.kind != "sigmoid_xent"
                                             or not 0.0 < config.loss.bce_target_threshold < 1.0):
        raise ConfigError(f"loss.bce_target_threshold={config.loss.bce_target_threshold}: binary targets are for "
                          "loss.kind='sigmoid_xent', with a threshold in (0, 1), e.g. 0.2")
    if config.loss.bce_target_threshold and config.objective not in ("classification", "distillation"):
        raise ConfigError(f"loss.bce_target_threshold: objective '{config.objective}' has no label loss it binarises "
                          "(classification and distillation do)")
    if not 0.0 <= config.loss.cutmix_switch_prob <= 1.0:
        raise ConfigError(f"loss.cutmix_switch_prob={config.loss.cutmix_switch_prob}: give a probability in [0, 1]")
    if not objective.uses_labels and (config.loss.mixup_alpha or config.loss.cutmix_alpha
                                      or config.loss.label_smoothing):
        raise ConfigError(f"loss.mixup_alpha, cutmix_alpha and label_smoothing act on labels, which objective "
                          f"'{config.objective}' does not use: set them to 0")
    objective.check(config)


# ---------------------------------------------------------------------------------------------------------------------
# Durations.

@dataclasses.dataclass(frozen=True)
class Durations:
    total_steps: int
    warmup_steps: int
    steps_per_epoch: float
    eval_every: int  # 0: only at the end
    checkpoint_every: int
    fewshot_every: int


def _steps(steps: int, epochs: float, examples: int, steps_per_epoch: float, batch_size: int) -> int:
    if steps:
        return int(steps)
    if epochs:
        return max(1, int(math.ceil(epochs * steps_per_epoch)))
    if examples:
        return max(1, int(math.ceil(examples / batch_size)))
    return 0


def resolve_durations(config: ml_collections.ConfigDict, train_examples: int) -> Durations:
    """The one place where epochs and examples become steps."""
    b = config.batch_size
    spe = train_examples / b
    o, ck, ev, fs = config.optimizer, config.checkpoint, config.eval, config.eval.fewshot
    total = _steps(config.total_steps, config.total_epochs, config.total_examples, spe, b)
    return Durations(
        total_steps=total,
        warmup_steps=min(total, _steps(o.warmup_steps, o.warmup_epochs, o.warmup_examples, spe, b)),
        steps_per_epoch=spe,
        eval_every=_steps(ev.every_steps, ev.every_epochs, 0, spe, b),
        checkpoint_every=_steps(ck.every_steps, ck.every_epochs, 0, spe, b),
        fewshot_every=_steps(fs.every_steps, fs.every_epochs, 0, spe, b),
    )


def model_config(config: ml_collections.ConfigDict, num_classes: int, architecture=None):
    """The model config a training config describes (its family's: models/family.py); the head size comes from the
    dataset. `architecture` (the config of init.checkpoint) supplies the architecture when model.variant is empty;
    sizes set in the config still override it."""
    return models.model_config(config.model.to_dict(), num_classes, architecture)


def split_config_arg(arg: str | None, hint: str = "") -> dict[str, str]:
    """"variant=B/16,epochs=90" -> {"variant": "B/16", "epochs": "90"} (the syntax of `configs/x.py:ARGS`)."""
    out = {}
    for item in filter(None, (arg or "").split(",")):
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"config argument '{item}' is not name=value{hint}")
        out[name] = value
    return out


def config_module(path) -> Any:
    """A config file loaded by path as a module: how one config builds on another (config files are not a
    package), e.g. `config_module(Path(__file__).with_name("demo.py")).get_config()`."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(f"_vit_jax_config_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_config_args(arg: str | None, defaults: dict[str, str]) -> dict[str, str]:
    """`configs/x.py:variant=B/16,epochs=90` -> {"variant": "B/16", "epochs": "90"}; unknown names are errors."""
    out = dict(defaults)
    for name, value in split_config_arg(arg, f" (known: {', '.join(defaults)})").items():
        if name not in defaults:
            close = difflib.get_close_matches(name, list(defaults), n=1)
            raise ConfigError(f"unknown config argument '{name}'" + (f"; did you mean '{close[0]}'?" if close
                                                                      else f" (known: {', '.join(defaults)})"))
        out[name] = value
    return out
