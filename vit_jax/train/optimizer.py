"""Optimizers and learning-rate schedules from the config (optax).

Weight decay is decoupled (AdamW): added to the update after the adaptive scaling and multiplied by the learning-rate
schedule, the optax convention; by default only kernels (matrices) are decayed, not biases, norms, embeddings.
Layer-wise lr decay (`layer_decay`, train/layer_decay.py) scales the final update per layer, weight decay included.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax.train.layer_decay import is_on, layer_scales, scale_by_layer


def make_schedule(o: ml_collections.ConfigDict, total_steps: int, warmup_steps: int) -> optax.Schedule:
    """Linear warmup from 0, then cosine / linear decay to `end_lr_factor * lr`, rsqrt, staircase, or constant.

    staircase (BiT's schedule): the lr is multiplied by `staircase_factor` at each fraction `staircase_at` of
    `total_steps` (counted from step 0, warmup included).
    """
    lr, end = o.lr, o.lr * o.end_lr_factor
    decay_steps = max(total_steps - warmup_steps, 1)
    if o.schedule == "staircase":
        # join_schedules hands the schedule after warmup its step counted from the end of warmup.
        boundaries: dict[int, float] = {}
        for f in o.staircase_at:
            step = max(int(round(f * total_steps)) - warmup_steps, 1)
            boundaries[step] = boundaries.get(step, 1.0) * o.staircase_factor
        after = optax.piecewise_constant_schedule(lr, boundaries)
    elif o.schedule == "cosine":
        after = optax.cosine_decay_schedule(lr, decay_steps, alpha=o.end_lr_factor)
    elif o.schedule == "linear":
        after = optax.linear_schedule(lr, end, decay_steps)
    elif o.schedule == "rsqrt":
        timescale = o.rsqrt_timescale

        def after(step):
            return lr * jnp.sqrt(timescale / jnp.maximum(step + timescale, timescale))
    else:
        after = optax.constant_schedule(lr)
    if not warmup_steps:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), after], [warmup_steps])


def decay_mask(params: Any, mode: str) -> Any:
    if mode == "all":
        return jax.tree.map(lambda _: True, params)
    if mode == "none":
        return jax.tree.map(lambda _: False, params)
    return jax.tree_util.tree_map_with_path(lambda path, _: getattr(path[-1], "key", None) == "kernel", params)


def make_optimizer(o: ml_collections.ConfigDict, schedule: optax.Schedule, params: Any) -> optax.GradientTransformation:
    parts = []
    if o.grad_clip_norm:
        parts.append(optax.clip_by_global_norm(o.grad_clip_norm))
    mask = decay_mask(params, o.decay_mask)
    mu_dtype = jnp.dtype(o.mu_dtype)
    if o.name in ("adamw", "lamb"):
        parts.append(optax.scale_by_adam(b1=o.b1, b2=o.b2, eps=o.eps, mu_dtype=mu_dtype))
    elif o.name == "sgd":
        if o.momentum:
            parts.append(optax.trace(decay=o.momentum, nesterov=o.nesterov, accumulator_dtype=mu_dtype))
    elif o.name == "adafactor":
        # Factored second moments (memory ~ rows + columns per matrix) for the largest models; optional momentum.
        parts.append(optax.scale_by_factored_rms(decay_rate=o.b2 if o.b2 < 1 else 0.8, epsilon=1e-30))
        if o.b1:
            parts.append(optax.ema(o.b1, debias=False, accumulator_dtype=mu_dtype))
    else:
        raise ValueError(f"unknown optimizer {o.name!r}")
    if o.weight_decay:
        parts.append(optax.add_decayed_weights(o.weight_decay, mask))
    if o.name == "lamb":  # LAMB (You et al. 2020; DeiT III): the Adam step, decay included, rescaled per layer by
        parts.append(optax.scale_by_trust_ratio())  # ||params|| / ||update||, as optax.lamb orders it
    if is_on(o.layer_decay):  # off adds no transform: the optimizer state is the same as without the option
        parts.append(scale_by_layer(layer_scales(params, o.layer_decay)))
    parts.append(optax.scale_by_learning_rate(schedule))
    return optax.chain(*parts)
