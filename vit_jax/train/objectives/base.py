"""The objective seam: everything the trainer, `vit-jax eval`, `plan` and `bench` ask of what a run learns.

An objective is one class in its own module under train/objectives/, registered by name with `@register`. It owns:
- its settings: the config group `settings` with its keys and defaults (`defaults`, part of the config schema) and
  `check(config)` for what types alone cannot say;
- its model (`self.model`, built through the model-family registry, with any head or decoder it trains) and its
  analytic FLOPs per example (`self.flops`);
- the batch it reads (`batch_spec`: field -> per-batch shape and dtype; one spec for the trainer's checks, `plan`,
  `bench` and the synthetic batch);
- extra model state that is not trained by gradients (a frozen teacher, an EMA teacher): `init_extra`, sharded by
  `extra_logical_axes` with the same logical-axis rules as the parameters, updated after each applied step by
  `update_extra`, saved and restored with the run (state["extra"]). A second tower trained with the first is part of
  the objective's model (its parameters), not extra state. An EMA teacher that starts as a copy of the student sets
  `extra_from_params` (init_extra then also gets the fresh parameters); state that follows statistics of the batch
  (DINO's centre) sets `loss_aux`: the loss then returns (loss, aux) and update_extra gets aux (averaged over
  micro-batches); schedules over the run read `total_steps` (set when the train program is built);
- its loss, its evaluation (`eval_step`, `evaluate`) and what an evaluation reports (`report`), used both during
  training (its evaluator, named `evaluator` in eval.evaluators) and by `vit-jax eval`.

This package is part of the pure train step: it knows nothing of hooks, data pipelines or checkpoints.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar, Iterable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax.errors import UserError
from vit_jax.models.flops import Flops
from vit_jax.models.vit import FunctionalViT


class BatchFieldError(UserError, ValueError):
    """The batches lack a field the objective reads, or carry it in another shape."""


@dataclasses.dataclass(frozen=True)
class EvalReport:
    """What one evaluation reports: `metrics` (eval/... scalars, written to metrics.jsonl and the summary), the
    metric that ranks evaluations (`best`, with `higher_is_better`), and one line for the user."""
    metrics: dict[str, float]
    best: str
    higher_is_better: bool
    line: str


class Objective(abc.ABC):
    """One training objective. `inputs` and `loss` together are the train step's loss:
    `loss(params, inputs(batch, key), key, extra)`, where the inputs may be split row-wise into micro-batches first;
    gradients flow to `params` only."""

    name: ClassVar[str] = ""  # config.objective
    evaluator: ClassVar[str] = ""  # its own evaluator's name in eval.evaluators
    settings: ClassVar[str] = ""  # the config group of its own settings ("" = none); they shape the model and loss
    # Those settings as a frozen dataclass that validates itself (MAEConfig): its fields and defaults are the group's
    # keys in the config schema; or, without one, the group's keys and defaults as a dict.
    settings_type: ClassVar[type | None] = None
    defaults: ClassVar[dict[str, Any]] = {}
    uses_labels: ClassVar[bool] = True  # False: labels unused (no head from the dataset; label options refused)
    pretraining: ClassVar[bool] = False  # trains from scratch, every layer at one lr (no init checkpoint)
    extra_from_params: ClassVar[bool] = False  # init_extra(key, params): the extra state starts from the parameters
    loss_aux: ClassVar[bool] = False  # loss returns (loss, aux); update_extra(extra, params, step, aux)
    total_steps: int = 0  # the run's length in steps, set by train/program.build_program (0: not known)

    model: FunctionalViT
    flops: Flops  # per example, of what the train step runs

    # --- construction and settings -------------------------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: ml_collections.ConfigDict, model_cfg: Any) -> "Objective":
        """The objective of a validated training config, around the model `model_cfg` describes."""

    @classmethod
    def settings_defaults(cls) -> dict[str, Any]:
        """The keys and defaults of its config group (train/config.default_config)."""
        return dataclasses.asdict(cls.settings_type()) if cls.settings_type else dict(cls.defaults)

    @classmethod
    def settings_of(cls, config: ml_collections.ConfigDict) -> Any:
        """Its settings_type built from the config's group (which validates them)."""
        return cls.settings_type(**config[cls.settings].to_dict())

    @classmethod
    def check(cls, config: ml_collections.ConfigDict) -> None:
        """Raises a one-line error for settings of this objective that cannot work (types are already checked);
        called by train/config.validate before any data is read. By default: its settings_type's own checks."""
        if cls.settings_type:
            cls.settings_of(config)

    @classmethod
    def keep_with_run(cls, config: ml_collections.ConfigDict, run_dir: str, write: bool) -> dict[str, Any]:
        """Files besides the state that the run needs (a text tower's tokenizer): copied into `run_dir` when the run
        first starts (by the process that writes the run's files: `write`) and used from there in this process, by
        the run, its resumptions and `vit-jax eval`/`predict` of it (write=False; `run_dir` may then be one of its
        checkpoints). Returns what the run's metadata records of them ("run_files"); {} (the default): none."""
        return {}

    @classmethod
    def head_classes(cls, config: ml_collections.ConfigDict, dataset_classes: int) -> int:
        """The size of the model's classification head: the dataset's classes, or 0 for an objective that does not
        read labels (a pretraining head, if any, is the objective's own)."""
        return dataset_classes if cls.uses_labels else 0

    # --- the batch -------------------------------------------------------------------------------------------------
    def batch_spec(self, batch_size: int) -> dict[str, tuple[tuple[int, ...], Any]]:
        """field -> (shape, dtype) of a global batch the loss reads (the pipeline's batch contract, docs/data.md)."""
        # A model whose example is not one image says so with `input_shape` (a video model's clip: (T, H, W, 3)).
        example = getattr(self.model.cfg, "input_shape", None) or (*self.model.cfg.image_size, 3)
        spec = {"image": ((batch_size, *example), jnp.float32)}
        if self.uses_labels:
            n = self.model.cfg.num_classes
            spec.update(labels=((batch_size, n), jnp.float32), label=((batch_size,), jnp.int32))
        return spec

    def synthetic_batch(self, key: jax.Array, batch_size: int) -> dict[str, jax.Array]:
        """A random batch of the spec (benchmarks, plans): images uniform in [-1, 1], one-hot labels of random
        classes, other integer fields random in [0, 2), other floats uniform in [0, 1)."""
        spec = self.batch_spec(batch_size)
        keys = dict(zip(spec, jax.random.split(key, len(spec))))
        out = {}
        for field, (shape, dtype) in spec.items():
            if field == "image":
                out[field] = jax.random.uniform(keys[field], shape, dtype, -1.0, 1.0)
            elif jnp.issubdtype(dtype, jnp.integer):
                out[field] = jax.random.randint(keys[field], shape, 0, 2).astype(dtype)
            else:
                out[field] = jax.random.uniform(keys[field], shape, dtype)
        if "labels" in spec and "label" in spec:  # one class per example, as the pipeline's one-hot labels
            n = spec["labels"][0][1]
            out["label"] = jax.random.randint(keys["label"], (batch_size,), 0, n).astype(jnp.int32)
            out["labels"] = jax.nn.one_hot(out["label"], n, dtype=jnp.float32)
        return out

    def check_batch(self, batch: dict[str, Any]) -> None:
        """A one-line error (at trace time: shapes are static) when a batch lacks a field of the spec or carries
        it in another shape; extra fields are allowed."""
        for field, (shape, _) in self.batch_spec(0).items():
            if field not in batch:
                raise BatchFieldError(f"objective '{self.name}' reads a `{field}` field the batches do not have "
                                      f"(they have {', '.join(sorted(batch))}): produce it in data.pp_train/pp_eval")
            if tuple(batch[field].shape[1:]) != tuple(shape[1:]):
                raise BatchFieldError(f"objective '{self.name}' reads `{field}` of per-example shape {shape[1:]}, "
                                      f"the batches carry {tuple(batch[field].shape[1:])}")

    # --- extra model state -------------------------------------------------------------------------------------------
    def init_extra(self, key: jax.Array) -> Any | None:
        """The extra state's initial value (a pytree of arrays, e.g. a teacher's parameters), or None: none. With
        `extra_from_params`, called as init_extra(key, params) with the run's fresh parameters."""
        return None

    def extra_shapes(self) -> Any | None:
        """The extra state's abstract shapes (ShapeDtypeStructs), or None: none."""
        args = (self.model.shapes,) if self.extra_from_params else ()
        return jax.eval_shape(self.init_extra, jax.random.key(0), *args)

    def extra_logical_axes(self) -> Any | None:
        """Logical axes of the extra state's arrays (as FunctionalViT.logical_axes), or None: replicated."""
        return None

    def update_extra(self, extra: Any, params: Any, step: jax.Array) -> Any:
        """The extra state after an applied step to `params` (now at `step`); frozen by default. With `loss_aux`,
        called as update_extra(extra, params, step, aux) with the step's aux from the loss."""
        return extra

    # --- the loss ------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def inputs(self, batch: dict[str, jax.Array], key: jax.Array) -> dict[str, jax.Array]:
        """The per-example arrays (leading axis: the global batch) the loss reads; `key` is the step's key."""

    @abc.abstractmethod
    def loss(self, params: Any, inputs: dict[str, jax.Array], key: jax.Array, extra: Any = None) -> jax.Array:
        """The mean loss over the rows of `inputs`; `key` drives dropout and the like; `extra`: the extra state."""

    # --- evaluation --------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def eval_step(self) -> Callable:
        """(params, eval batch with `_mask`) -> sums over the real rows: `count` and the metrics. With extra state,
        the first argument is (params, extra)."""

    def evaluate(self, eval_step: Callable, params: Any, batches: Iterable[dict]) -> dict[str, Any]:
        """The eval step's sums over all batches, reduced to the evaluation's results (means by default)."""
        from vit_jax.eval.classification import evaluate

        return evaluate(eval_step, params, batches)

    @abc.abstractmethod
    def report(self, result: dict[str, Any], config: ml_collections.ConfigDict) -> EvalReport:
        """What `result` (from `evaluate`) reports: metrics, the ranking metric, and the user's line."""


def needs_rng(cfg: Any) -> bool:
    """Whether the model's forward pass draws randomness in training (dropout, stochastic depth: ViT options; a
    family without them has no such fields)."""
    return any(getattr(cfg, k, 0.0) for k in ("dropout", "attention_dropout", "drop_path"))


def mean_result_line(result: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    """`name value | ... | N examples` of every scalar of `result` but the count (the generic report line)."""
    shown = [f"{k} {float(v):.4f}" for k, v in result.items()
             if k not in ("count", "undecodable", *skip) and np.ndim(v) == 0]
    return " | ".join([*shown, f"{int(result['count'])} examples"])
