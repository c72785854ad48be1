"""The jitted-function bodies of evaluation, shared by training (hooks, program) and the `vit-jax eval` command."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from vit_jax.models.losses import LOSSES
from vit_jax.models.vit import FunctionalViT


def example_shape(cfg) -> tuple[int, ...]:
    """One input of the model: (H, W, 3) for an image model, (T, H, W, 3) for a video model (its `input_shape`)."""
    return tuple(getattr(cfg, "input_shape", (*cfg.image_size, 3)))


def has_views(cfg, ndim: int) -> bool:
    """Whether inputs of `ndim` dimensions carry a views axis, (N, V, *example_shape); a dense backbone's feature maps
    are never averaged over views."""
    return ndim == len(example_shape(cfg)) + 2 and not cfg.dense


def over_views(fn: Callable, cfg, inputs: jax.Array) -> jax.Array:
    """fn(inputs) for a batch of the model's inputs (B, *example_shape), or for views of each (B, V, *example_shape:
    a video's temporal x spatial views, video_ops.py) the mean of fn's per-view outputs: scenic's multi-view
    evaluation, which averages the logits (the views run as one batch of B*V)."""
    rank = len(example_shape(cfg)) + 1
    if inputs.ndim == rank:
        return fn(inputs)
    if inputs.ndim != rank + 1:
        raise ValueError(f"{cfg.name} takes inputs of shape (batch, {', '.join(map(str, example_shape(cfg)))}) or "
                         f"views of them (batch, views, ...), got {tuple(inputs.shape)}")
    b, v = inputs.shape[:2]
    out = fn(inputs.reshape(b * v, *inputs.shape[2:]))
    return out.reshape(b, v, *out.shape[1:]).mean(1)


def make_eval_step(model: FunctionalViT, loss_kind: str = "softmax_xent") -> Callable:
    """Sums (not means) over the masked batch, so padded examples never count and totals are exact. Inputs with a
    views axis are classified by their views' mean logits (over_views)."""
    loss_fn = LOSSES[loss_kind]

    def eval_step(params, batch):
        logits = over_views(lambda x: model.apply(params, x)[0], model.cfg, batch["image"])
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
    """Pre-logits features (for few-shot evaluation); of views, their mean."""

    def fn(params, images):
        return over_views(lambda x: model.apply(params, x)[1]["pre_logits"].astype(jnp.float32), model.cfg, images)

    return fn
