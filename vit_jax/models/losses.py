"""Classification losses on a model's logits, per example: shared by the train step and the eval step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def softmax_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return -jnp.sum(labels * jax.nn.log_softmax(logits.astype(jnp.float32)), axis=-1)


def sigmoid_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.sum(optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), labels), axis=-1)


LOSSES = {"softmax_xent": softmax_xent, "sigmoid_xent": sigmoid_xent}


def smooth_labels(labels: jax.Array, smoothing: float) -> jax.Array:
    if not smoothing:
        return labels
    return labels * (1.0 - smoothing) + smoothing / labels.shape[-1]


def threshold_targets(labels: jax.Array, threshold: float) -> jax.Array:
    """Binary targets from soft (smoothed, mixed) ones: 1 where a class's weight exceeds `threshold`, else 0 (timm's
    BinaryCrossEntropy target_threshold, DeiT III / "ResNet strikes back": after mixup or CutMix both images' classes
    are positives for the sigmoid loss). 0 leaves the targets as they are."""
    if not threshold:
        return labels
    return (labels > threshold).astype(labels.dtype)
