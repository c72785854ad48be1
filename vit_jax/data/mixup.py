"""Mixup (Zhang et al. 2018) and CutMix (Yun et al. 2019) as pure JAX functions, applied on device inside the
jitted train step.

One lambda per batch, lambda ~ Beta(alpha, alpha); each example is mixed with the batch reversed (example i with
example B-1-i), which needs no extra randomness and no gather across shards beyond a reverse. `mix` switches between
the two per batch, as DeiT's recipe does.
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


def cutmix_box(rng: jax.Array, lam: jax.Array, height: int, width: int) -> tuple[jax.Array, jax.Array]:
    """CutMix's box (Yun et al. 2019) as an (H, W) boolean mask, and lambda corrected to the pixels kept.

    The box's sides are H*sqrt(1-lam) and W*sqrt(1-lam) (floored), its centre uniform over the pixels, and it is
    clipped to the image, so the corrected lambda = 1 - (box area after clipping) / (H*W), as in the paper's code.
    """
    cut = jnp.sqrt(1.0 - lam)
    cut_h, cut_w = jnp.floor(height * cut).astype(jnp.int32), jnp.floor(width * cut).astype(jnp.int32)
    k_y, k_x = jax.random.split(rng)
    cy, cx = jax.random.randint(k_y, (), 0, height), jax.random.randint(k_x, (), 0, width)
    y0, y1 = jnp.clip(cy - cut_h // 2, 0, height), jnp.clip(cy + cut_h // 2, 0, height)
    x0, x1 = jnp.clip(cx - cut_w // 2, 0, width), jnp.clip(cx + cut_w // 2, 0, width)
    ys, xs = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
    box = (ys >= y0) & (ys < y1) & (xs >= x0) & (xs < x1)
    return box, 1.0 - ((y1 - y0) * (x1 - x0)).astype(jnp.float32) / (height * width)


def mix(batch: dict, rng: jax.Array, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0,
        switch_prob: float = 0.5) -> dict:
    """Mixup or CutMix on a batch, one choice and one lambda per batch (DeiT's recipe: timm's Mixup with
    mixup 0.8, cutmix 1.0, switch 0.5). With both alphas > 0, CutMix is drawn with probability `switch_prob`;
    with one, that one. Each example is mixed with the batch reversed; labels by the (corrected) lambda.
    Adds `mixup_lambda` and `cutmix` (whether the batch was cut) to the batch."""
    if not cutmix_alpha:
        return {**mixup(batch, rng, mixup_alpha), "cutmix": jnp.bool_(False)}
    k_switch, k_lam, k_box, k_mix = jax.random.split(rng, 4)
    use_cutmix = jax.random.bernoulli(k_switch, switch_prob) if mixup_alpha else jnp.bool_(True)
    images, labels = batch["image"], batch["labels"]
    lam = jax.random.beta(k_lam, cutmix_alpha, cutmix_alpha, dtype=jnp.float32)
    # The box is over the last two spatial axes: (B, H, W, C) images, and (B, T, H, W, C) clips, whose every frame
    # is cut at the same place (the pasted region is one clip's tube, as the label mix assumes).
    box, cut_lam = cutmix_box(k_box, lam, images.shape[-3], images.shape[-2])
    cut_images = jnp.where(box[:, :, None], jnp.flip(images, 0), images)
    mixed = mixup(batch, k_mix, mixup_alpha) if mixup_alpha else {**batch, "mixup_lambda": jnp.float32(1.0)}
    lam = jnp.where(use_cutmix, cut_lam, mixed["mixup_lambda"])
    out = dict(batch)
    out["image"] = jnp.where(use_cutmix, cut_images, mixed["image"]).astype(images.dtype)
    out["labels"] = (lam * labels + (1.0 - lam) * jnp.flip(labels, 0)).astype(labels.dtype)
    out["mixup_lambda"], out["cutmix"] = lam, use_cutmix
    return out
