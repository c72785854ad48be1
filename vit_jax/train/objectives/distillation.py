"""`distillation`: a student learns from a frozen teacher loaded from any checkpoint vit_jax reads (settings
`distill.*`).

The teacher is whatever `checkpoints.loading.load_any` returns (one of our runs, an official ViT/AugReg or big_vision
`.npz`, a timm `.safetensors`, a BiT ResNet), held as the objective's extra state: sharded by the parameters' own
logical-axis rules (a teacher bigger than one device fits under FSDP), kept in the dtype it was stored in, saved and
restored with the run, and never updated (`update_extra` is the base class's identity). Its forward pass is counted in
the run's FLOPs once per image (Flops.frozen_forward: no backward pass).

Modes (`distill.mode`), the teacher always seeing exactly the student's batch (the same crop, the same mixup):
- `soft` (Hinton et al. 2015; DeiT's soft distillation): tau^2 * KL(softmax(t/tau) || softmax(s/tau)), summed over
  classes and averaged over the batch (big_vision's `dist(kind='kl')`; DeiT divides by batch x classes instead, its
  issue #61 — a constant factor the learning rate absorbs);
- `hard` (DeiT): cross-entropy of the student against the teacher's top class, no smoothing on it;
- `function_matching` (Beyer et al. 2022, "a good teacher is patient and consistent"): the KL at tau = 1 on the
  identical mixup'd batch (set loss.mixup_alpha / cutmix_alpha; the recipe pairs it with very long schedules).
`distill.alpha` mixes in the label loss: (1 - alpha) * label loss (loss.kind, with label smoothing) + alpha *
distillation loss (DeiT's alpha; 1.0 = the teacher alone). A student with DeiT's distillation token
(model.distilled=True) trains its class head on the labels and its distillation head on the teacher; it predicts
with their average.

Its evaluator `distillation` reports the classification metrics, the teacher's top-1 on the same images and how
often student and teacher agree on the top class.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from vit_jax.data.mixup import mix
from vit_jax.errors import ConfigError
from vit_jax.eval.steps import make_eval_step
from vit_jax.models.build import build_model, describe, model_flops
from vit_jax.models.flops import Flops
from vit_jax.models.losses import LOSSES, smooth_labels, threshold_targets
from vit_jax.train.objectives.base import EvalReport, Objective, needs_rng
from vit_jax.train.objectives.registry import register

MODES = ("soft", "hard", "function_matching")


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """The `distill.*` settings; each field's meaning is in the module docstring."""

    teacher: str = ""  # a checkpoint load_any reads (required; may name an earlier stage as "{workdir}/teacher")
    mode: str = "soft"  # soft | hard | function_matching
    temperature: float = 1.0  # tau of `soft` (DeiT's soft distillation used 3.0); function matching is at 1.0
    alpha: float = 0.5  # weight of the distillation loss; the label loss gets 1 - alpha
    teacher_image_size: int = 0  # the teacher's resolution, for a checkpoint that does not record it (.npz)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"distill.mode={self.mode!r} is not one of {MODES}")
        if not self.temperature > 0:
            raise ConfigError(f"distill.temperature={self.temperature}: give a positive temperature, e.g. 1.0")
        if self.mode == "function_matching" and self.temperature != 1.0:
            raise ConfigError(f"distill.mode='function_matching' is the KL at temperature 1; distill.temperature="
                              f"{self.temperature} is for mode 'soft'")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"distill.alpha={self.alpha}: give the distillation loss's weight in [0, 1]")
        if self.teacher_image_size < 0:
            raise ConfigError(f"distill.teacher_image_size={self.teacher_image_size}: give a size in pixels or 0")


def soft_distillation(student_logits: jax.Array, teacher_logits: jax.Array, temperature: float) -> jax.Array:
    """Per example tau^2 * KL(softmax(teacher/tau) || softmax(student/tau)) (the tau^2 keeps the gradients' scale
    independent of tau, as Hinton et al. note)."""
    t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature)
    s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
    return temperature**2 * jnp.sum(jnp.exp(t) * (t - s), axis=-1)


def hard_distillation(student_logits: jax.Array, teacher_logits: jax.Array) -> jax.Array:
    """Per example cross-entropy of the student against the teacher's top class (DeiT's hard distillation)."""
    target = jax.nn.one_hot(jnp.argmax(teacher_logits, -1), teacher_logits.shape[-1], dtype=jnp.float32)
    return LOSSES["softmax_xent"](student_logits, target)


@register
class Distillation(Objective):
    name = "distillation"
    evaluator = "distillation"
    settings, settings_type = "distill", DistillConfig

    def __init__(self, model_cfg: Any, distill: DistillConfig, teacher_cfg: Any, teacher_params: dict,
                 loss_kind: str = "softmax_xent", label_smoothing: float = 0.0, mixup_alpha: float = 0.0,
                 cutmix_alpha: float = 0.0, cutmix_switch_prob: float = 0.5, bce_target_threshold: float = 0.0):
        if getattr(teacher_cfg, "num_classes", 0) != model_cfg.num_classes:
            raise ConfigError(f"distill.teacher predicts {getattr(teacher_cfg, 'num_classes', 0)} classes, the "
                              f"student {model_cfg.num_classes} (the dataset's): distil from a teacher with the "
                              "dataset's head")
        self.distill, self.loss_kind = distill, loss_kind
        self.label_smoothing, self.mixup_alpha = label_smoothing, mixup_alpha
        self.cutmix_alpha, self.cutmix_switch_prob = cutmix_alpha, cutmix_switch_prob
        self.bce_target_threshold = bce_target_threshold
        self.model = build_model(model_cfg)
        self.teacher = build_model(teacher_cfg)
        self.teacher_params = teacher_params
        self.needs_rng = needs_rng(model_cfg)
        student = model_flops(model_cfg)
        self.flops = Flops(forward=student.forward, breakdown=student.breakdown,
                           frozen_forward=model_flops(teacher_cfg).forward)

    @classmethod
    def from_config(cls, config, model_cfg):
        from vit_jax.checkpoints.loading import load_any  # the teacher is read once, when the run is built

        distill = cls.settings_of(config)
        size = distill.teacher_image_size
        teacher_cfg, params = load_any(distill.teacher, fallback_image_size=(size, size) if size else None)
        loss = config.loss
        return cls(model_cfg, distill, teacher_cfg, params, loss.kind, loss.label_smoothing, loss.mixup_alpha,
                   loss.cutmix_alpha, loss.cutmix_switch_prob, loss.bce_target_threshold)

    @classmethod
    def check(cls, config):
        distill = cls.settings_of(config)
        if not distill.teacher:
            raise ConfigError("objective 'distillation' needs distill.teacher: a checkpoint to learn from (a run's "
                              "workdir, an official .npz, a timm .safetensors)")
        if config.model.get("dense"):
            raise ConfigError("model.dense=True builds a backbone without the head objective 'distillation' trains")

    def describe_teacher(self) -> str:
        return describe(self.teacher.cfg)

    # --- the frozen teacher ---------------------------------------------------------------------------------------
    def init_extra(self, key):
        del key  # the teacher is loaded, not drawn
        return {"teacher": jax.tree.map(jnp.asarray, self.teacher_params)}

    def extra_logical_axes(self):
        return {"teacher": self.teacher.logical_axes}

    def teacher_logits(self, extra: dict, images: jax.Array) -> jax.Array:
        """The teacher's logits on exactly the student's images (resized when it was trained at another size)."""
        size = tuple(self.teacher.cfg.image_size)
        if tuple(images.shape[1:3]) != size:
            images = jax.image.resize(images, (images.shape[0], *size, images.shape[3]), "bilinear")
        logits, _ = self.teacher.apply(extra["teacher"], images)
        return jax.lax.stop_gradient(logits.astype(jnp.float32))

    # --- the loss -----------------------------------------------------------------------------------------------------
    def inputs(self, batch, key):
        self.check_batch(batch)
        return {"image": batch["image"],
                "labels": smooth_labels(batch["labels"].astype(jnp.float32), self.label_smoothing)}

    def loss(self, params, inputs, key, extra=None):
        return jnp.mean(self.per_example_loss(params, inputs, key, extra))

    def per_example_loss(self, params, inputs, key, extra) -> jax.Array:
        """(1 - alpha) * label loss + alpha * distillation loss per example, on one (mixup'd) batch that student and
        teacher both see."""
        k_mix, k_model = jax.random.split(key)
        batch = {"image": inputs["image"], "labels": inputs["labels"]}
        if self.mixup_alpha or self.cutmix_alpha:
            batch = mix(batch, k_mix, self.mixup_alpha, self.cutmix_alpha, self.cutmix_switch_prob)
        logits, out = self.model.apply(params, batch["image"], train=True, rng=k_model if self.needs_rng else None)
        # With DeiT's distillation token, the class head learns the labels and the distillation head the teacher.
        cls_logits, dist_logits = out.get("cls_logits", logits), out.get("dist_logits", logits)
        d = self.distill
        teacher = self.teacher_logits(extra, batch["image"])
        if d.mode == "hard":
            dist = hard_distillation(dist_logits, teacher)
        else:
            dist = soft_distillation(dist_logits, teacher, d.temperature)
        if d.alpha == 1.0:
            return dist
        labels = threshold_targets(batch["labels"], self.bce_target_threshold)  # DeiT III's BCE targets, if set
        return (1.0 - d.alpha) * LOSSES[self.loss_kind](cls_logits, labels) + d.alpha * dist

    # --- evaluation ---------------------------------------------------------------------------------------------------
    def eval_step(self):
        classify = make_eval_step(self.model, self.loss_kind)

        def eval_step(view, batch):
            params, extra = view
            sums = classify(params, batch)
            logits, _ = self.model.apply(params, batch["image"])
            student, teacher = jnp.argmax(logits, -1), jnp.argmax(self.teacher_logits(extra, batch["image"]), -1)
            mask = batch["_mask"].astype(jnp.float32)
            return {**sums, "teacher_top1": ((teacher == batch["label"]) * mask).sum(),
                    "agreement": ((student == teacher) * mask).sum()}

        return eval_step

    def report(self, result, config):
        metrics = {f"eval/{k}": v for k, v in result.items()}
        return EvalReport(metrics, "eval/top1", True,
                          f"top1 {100 * result['top1']:.2f}% | teacher top1 {100 * result['teacher_top1']:.2f}% | "
                          f"agreement {100 * result['agreement']:.2f}% | loss {result['loss']:.4f} | "
                          f"{int(result['count'])} examples")


distill_config = Distillation.settings_of  # config -> DistillConfig
