"""`classification`: softmax / sigmoid cross-entropy on the labels (with label smoothing and mixup; config `loss.*`).
Its evaluator `classification` reports top-1/top-5, precision@1 and the loss over the eval split, exact counts."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vit_jax.data.mixup import mix
from vit_jax.errors import ConfigError
from vit_jax.eval.steps import make_eval_step
from vit_jax.models.build import build_model, model_flops
from vit_jax.models.losses import LOSSES, smooth_labels, threshold_targets
from vit_jax.models.vit import FunctionalViT
from vit_jax.train.objectives.registry import register
from vit_jax.train.objectives.base import EvalReport, Objective, needs_rng


@register
class Classification(Objective):
    name = "classification"
    evaluator = "classification"

    def __init__(self, model: FunctionalViT, loss_kind: str = "softmax_xent", label_smoothing: float = 0.0,
                 mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0, cutmix_switch_prob: float = 0.5,
                 bce_target_threshold: float = 0.0):
        self.model, self.loss_kind = model, loss_kind
        self.label_smoothing, self.mixup_alpha = label_smoothing, mixup_alpha
        self.cutmix_alpha, self.cutmix_switch_prob = cutmix_alpha, cutmix_switch_prob
        self.bce_target_threshold = bce_target_threshold
        self.loss_fn = LOSSES[loss_kind]
        self.needs_rng = needs_rng(model.cfg)
        self.flops = model_flops(model.cfg)

    @classmethod
    def from_config(cls, config, model_cfg):
        loss = config.loss
        return cls(build_model(model_cfg), loss.kind, loss.label_smoothing, loss.mixup_alpha, loss.cutmix_alpha,
                   loss.cutmix_switch_prob, loss.bce_target_threshold)

    @classmethod
    def check(cls, config):
        if config.model.get("dense"):
            raise ConfigError("model.dense=True builds a backbone without the classification head objective "
                              "'classification' trains: choose an objective for dense features, or read them with "
                              "`vit-jax predict --features`")

    def inputs(self, batch, key):
        return {"image": batch["image"],
                "labels": smooth_labels(batch["labels"].astype(jnp.float32), self.label_smoothing)}

    def loss(self, params, inputs, key, extra=None):
        images, labels = inputs["image"], inputs["labels"]
        k_mix, k_model = jax.random.split(key)
        if self.mixup_alpha or self.cutmix_alpha:
            mixed = mix({"image": images, "labels": labels}, k_mix, self.mixup_alpha, self.cutmix_alpha,
                        self.cutmix_switch_prob)
            images, labels = mixed["image"], mixed["labels"]
        labels = threshold_targets(labels, self.bce_target_threshold)  # smoothed, mixed, then binarised (timm's order)
        logits, _ = self.model.apply(params, images, train=True, rng=k_model if self.needs_rng else None)
        return jnp.mean(self.loss_fn(logits, labels))

    def eval_step(self):
        return make_eval_step(self.model, self.loss_kind)

    def report(self, result, config):
        # The headline metric: precision@1 for sigmoid (multi-label, e.g. ImageNet-21k) training, else top-1.
        sigmoid = config.loss.kind == "sigmoid_xent"
        metrics = {f"eval/{k}": v for k, v in result.items()}
        prec = f"prec@1 {100 * result['prec1']:.2f}% | " if sigmoid else ""
        return EvalReport(metrics, "eval/prec1" if sigmoid else "eval/top1", True,
                          f"{prec}top1 {100 * result['top1']:.2f}% | top5 {100 * result['top5']:.2f}% | "
                          f"loss {result['loss']:.4f} | {int(result['count'])} examples")
