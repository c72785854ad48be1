"""Mixup (Zhang et al. 2018) as a pure JAX function, applied on device inside the jitted train step.

One lambda per batch, lambda ~ Beta(alpha, alpha); each example is mixed with the batch reversed (example i with
example B-1-i), which needs no extra randomness and no gather across shards beyond a reverse.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mixup(batch: dict, rng: jax.Array, alpha: float = 0.2, keys: tuple[str, ...] = ("image", "labels")) -> dict:
    """Returns a copy of `batch` with `keys` replaced by lam * x + (1 - lam) * x[::-1] and `mixup_lambda` added.

    alpha <= 0 disables mixing (lam = 1). Other keys (`label`, `_mask`) are passed through unchanged.
    """
    if alpha <= 0:
        lam = jnp.float32(1.0)
    else:
        lam = jax.random.beta(rng, alpha, alpha, dtype=jnp.float32)
    out = dict(batch)
    for key in keys:
        x = batch[key]
        out[key] = (lam * x + (1.0 - lam) * jnp.flip(x, axis=0)).astype(x.dtype)
    out["mixup_lambda"] = lam
    return out
