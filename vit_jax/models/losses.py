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
