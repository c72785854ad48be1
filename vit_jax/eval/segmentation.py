"""Segmentation metrics, exact over a whole eval split: one confusion matrix of pixel counts is summed over all
batches (in float64 on the host) and mIoU and pixel accuracy are computed from it once, never averaged per batch.

- pixel accuracy: correctly classified labelled pixels / labelled pixels;
- IoU of class c: TP / (TP + FP + FN) from the confusion matrix; mIoU: the mean over the classes that occur in the
  labels or the predictions (a class absent from both has no IoU, as in the usual mmseg/torchmetrics convention).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models.segmentation import confusion_matrix, pixel_cross_entropy
from vit_jax.models.vit import FunctionalViT


def make_segmentation_eval_step(model: FunctionalViT) -> Callable:
    """(params, batch with image, segmentation, _mask) -> sums: count (examples), pixels, loss (summed per labelled
    pixel), confusion (K, K)."""

    def eval_step(params, batch):
        logits, _ = model.apply(params, batch["image"])
        mask = batch["_mask"]
        confusion = confusion_matrix(logits, batch["segmentation"], mask)
        pixels = confusion.sum()
        return {"count": mask.astype(jnp.float32).sum(), "pixels": pixels, "confusion": confusion,
                "loss": pixel_cross_entropy(logits, batch["segmentation"], mask) * jnp.maximum(pixels, 1.0)}

    return eval_step


def metrics_from_confusion(confusion: np.ndarray) -> dict[str, Any]:
    """{"miou", "pixel_acc", "iou" (per class; NaN where the class occurs nowhere)} of a (K, K) confusion matrix."""
    confusion = np.asarray(confusion, np.float64)
    tp = np.diag(confusion)
    union = confusion.sum(0) + confusion.sum(1) - tp
    iou = np.where(union > 0, tp / np.maximum(union, 1e-12), np.nan)
    total = confusion.sum()
    return {"miou": float(np.nanmean(iou)) if np.any(union > 0) else 0.0,
            "pixel_acc": float(tp.sum() / total) if total else 0.0, "iou": iou}


def evaluate_segmentation(eval_step: Callable, params: Any, batches: Iterable[dict]) -> dict[str, Any]:
    """Runs `eval_step` over all batches; returns count, loss (per labelled pixel), miou, pixel_acc and per-class
    iou from the summed confusion matrix."""
    totals: dict[str, np.ndarray] = {}
    pending = None

    def accumulate(out):
        for k, v in jax.device_get(out).items():
            totals[k] = totals.get(k, 0.0) + np.asarray(v, np.float64)

    for batch in batches:
        out = eval_step(params, batch)
        if pending is not None:  # fetch the previous batch's sums while this one runs
            accumulate(pending)
        pending = out
    if pending is not None:
        accumulate(pending)
    if not totals or not totals["count"]:
        raise ValueError("the evaluation split is empty")
    result = metrics_from_confusion(totals["confusion"])
    result.update(count=float(totals["count"]), loss=float(totals["loss"] / max(float(totals["pixels"]), 1.0)))
    return result
