"""The jitted-function bodies of evaluation, shared by training (hooks, program) and the `vit-jax eval` command."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from vit_jax.models.losses import LOSSES
from vit_jax.models.vit import FunctionalViT


def make_eval_step(model: FunctionalViT, loss_kind: str = "softmax_xent") -> Callable:
    """Sums (not means) over the masked batch, so padded examples never count and totals are exact."""
    loss_fn = LOSSES[loss_kind]

    def eval_step(params, batch):
        logits, _ = model.apply(params, batch["image"])
        mask = batch["_mask"].astype(jnp.float32)
        labels = batch["labels"].astype(jnp.float32)
        label = batch["label"]
        top1 = jnp.argmax(logits, -1)
        k = min(5, logits.shape[-1])
        topk = jax.lax.top_k(logits, k)[1]
        return {
            "count": mask.sum(),
            "loss": (loss_fn(logits, labels) * mask).sum(),
            "top1": ((top1 == label) * mask).sum(),
            "top5": (jnp.any(topk == label[:, None], -1) * mask).sum(),
            # multi-label: is the top prediction one of the example's labels
            "prec1": ((jnp.take_along_axis(labels, top1[:, None], -1)[:, 0] > 0) * mask).sum(),
        }

    return eval_step


def features_step(model: FunctionalViT) -> Callable:
    """Pre-logits features (for few-shot evaluation)."""

    def fn(params, images):
        return model.apply(params, images)[1]["pre_logits"].astype(jnp.float32)

    return fn
