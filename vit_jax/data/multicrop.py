"""DINO's multi-crop augmentation and iBOT's block masks, as jax functions of a global batch on the devices.

Why on the devices and not as ops of the input pipeline: every crop of an example is drawn from
`fold_in(fold_in(key, row), crop)` with `row` the example's index in the global batch and `key` the train step's key,
so the crops do not depend on how the batch is split over processes, devices or micro-batches, and a resumed run
redraws exactly the crops of the uninterrupted one (the step's key is a function of the step) with no pipeline state
to save. The input pipeline delivers one image per example (data.pp_train, e.g. `decode|resize(S)|value_range(-1,1)`);
`multi_crop` makes 2 global crops and N local ones of it.

The augmentations are DINO's (main_dino.py DataAugmentationDINO; DINOv2 data/augmentations.py): random resized crop
(global scale 0.32-1, local 0.05-0.32 in DINOv2; 0.4-1 and 0.05-0.4 in DINO v1), horizontal flip, colour jitter
(brightness 0.4, contrast 0.4, saturation 0.2, hue 0.1; p=0.8, applied in that fixed order rather than torchvision's
random order), grayscale (p=0.2), Gaussian blur (sigma 0.1-2 at 224 px, scaled with the crop size; p=1 on the first
global crop, 0.1 on the second, 0.5 on local crops) and solarisation (p=0.2, second global crop only). Images are in
[-1, 1].
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

CROP_STREAM = 0x44494E4F  # fold_in constant of the crops' random stream ("DINO")
MASK_STREAM = 0x69424F54  # and of iBOT's masks ("iBOT")


@dataclasses.dataclass(frozen=True)
class CropSpec:
    """One kind of crop: output size, area scale range, and the probabilities of blur and solarisation."""

    size: int
    scale: tuple[float, float]
    blur: float
    solarize: float
    augment: bool = True  # False: crop and flip only
    flip: bool = True  # random horizontal flips


def random_resized_crop(image: jax.Array, key: jax.Array, size: int, scale: tuple[float, float],
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> jax.Array:
    """A crop of a random area fraction in `scale` and aspect ratio in `ratio` (log-uniform), resized to
    size x size with antialiased bilinear interpolation (torchvision's RandomResizedCrop, without its retries:
    the sides are clipped to the image instead)."""
    h, w = image.shape[:2]
    u = jax.random.uniform(key, (4,))  # one draw for all four numbers: each random call costs compile time
    area = (scale[0] + (scale[1] - scale[0]) * u[0]) * h * w
    r = jnp.exp(math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[1])
    cw = jnp.clip(jnp.sqrt(area * r), 1.0, w)
    ch = jnp.clip(jnp.sqrt(area / r), 1.0, h)
    y0 = u[2] * (h - ch)
    x0 = u[3] * (w - cw)
    return jnp.einsum("oh,hwc,pw->opc", resample_matrix(y0, ch, size, h), image, resample_matrix(x0, cw, size, w))


def resample_matrix(start: jax.Array, length: jax.Array, out: int, n_in: int) -> jax.Array:
    """(out, n_in) weights that resample the interval [start, start + length) of n_in pixels to `out` pixels with a
    triangle (bilinear) kernel widened by the scale when shrinking (antialiasing, as jax.image.scale_and_translate's
    'linear'); a matmul, which compiles in a fraction of scale_and_translate's time under vmap."""
    step = length / out  # input pixels per output pixel
    centres = start + (jnp.arange(out) + 0.5) * step - 0.5
    support = jnp.maximum(step, 1.0)
    w = jnp.maximum(0.0, 1.0 - jnp.abs(jnp.arange(n_in)[None, :] - centres[:, None]) / support)
    return w / jnp.maximum(w.sum(axis=1, keepdims=True), 1e-12)


def _gray(u: jax.Array) -> jax.Array:
    return (u @ jnp.asarray([0.299, 0.587, 0.114], u.dtype))[..., None]


_TO_YIQ = np.asarray([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_FROM_YIQ = np.linalg.inv(_TO_YIQ)


def _hue_shift(u: jax.Array, shift: jax.Array) -> jax.Array:
    """Rotates the chroma in YIQ space by `shift` turns (a hue shift; torchvision works in HSV, the same idea)."""
    a = 2 * jnp.pi * shift
    c, s = jnp.cos(a), jnp.sin(a)
    rot = jnp.stack([jnp.stack([1.0, 0.0, 0.0]), jnp.stack([0.0, c, -s]), jnp.stack([0.0, s, c])]).astype(u.dtype)
    m = jnp.asarray(_FROM_YIQ, u.dtype) @ rot @ jnp.asarray(_TO_YIQ, u.dtype)
    return u @ m.T


def colour_jitter(u: jax.Array, key: jax.Array) -> jax.Array:
    """DINO's ColorJitter(0.4, 0.4, 0.2, 0.1) on an image in [0, 1]."""
    r = jax.random.uniform(key, (4,))
    u = jnp.clip(u * (0.6 + 0.8 * r[0]), 0, 1)  # brightness
    mean = _gray(u).mean()
    u = jnp.clip((u - mean) * (0.6 + 0.8 * r[1]) + mean, 0, 1)  # contrast
    g = _gray(u)
    u = jnp.clip(g + (u - g) * (0.8 + 0.4 * r[2]), 0, 1)  # saturation
    return jnp.clip(_hue_shift(u, -0.1 + 0.2 * r[3]), 0, 1)  # hue


def gaussian_blur(u: jax.Array, sigma: jax.Array, radius: int) -> jax.Array:
    """Separable Gaussian blur of (H, W, C) with a traced `sigma` over a fixed `radius` (edge pixels repeated)."""
    t = jnp.arange(-radius, radius + 1, dtype=u.dtype)
    k = jnp.exp(-0.5 * (t / sigma) ** 2)
    k = k / k.sum()
    p = jnp.pad(u, ((radius, radius), (radius, radius), (0, 0)), mode="edge")
    h, w = u.shape[:2]
    p = sum(k[i] * p[i:i + h] for i in range(2 * radius + 1))
    return sum(k[i] * p[:, i:i + w] for i in range(2 * radius + 1))


def augment_crop(image: jax.Array, key: jax.Array, spec: CropSpec) -> jax.Array:
    """One crop of `image` ((H, W, 3) in [-1, 1]) with DINO's augmentations for its kind."""
    k_crop, k_jit, k_coins = jax.random.split(key, 3)
    # flip, jitter?, grayscale?, blur?, blur sigma, solarise?: one draw (each random call costs compile time)
    coin = jax.random.uniform(k_coins, (6,))
    x = random_resized_crop(image, k_crop, spec.size, spec.scale)
    if spec.flip:
        x = jnp.where(coin[0] < 0.5, x[:, ::-1], x)
    if not spec.augment:
        return x
    u = (x + 1.0) / 2.0
    u = jnp.where(coin[1] < 0.8, colour_jitter(u, k_jit), u)
    u = jnp.where(coin[2] < 0.2, jnp.broadcast_to(_gray(u), u.shape), u)
    if spec.blur:
        scale = spec.size / 224  # DINO's sigma range is in pixels of a 224 px crop
        sigma = (0.1 + 1.9 * coin[4]) * scale
        radius = max(1, int(math.ceil(3 * 2.0 * scale)))
        u = jnp.where(coin[3] < spec.blur, gaussian_blur(u, sigma, radius), u)
    if spec.solarize:
        u = jnp.where(coin[5] < spec.solarize, jnp.where(u >= 0.5, 1.0 - u, u), u)
    return u * 2.0 - 1.0


def multi_crop(images: jax.Array, key: jax.Array, specs: tuple[CropSpec, ...],
               rows: jax.Array | None = None) -> list[jax.Array]:
    """Images (B, H, W, 3) -> one (B, size, size, 3) array per crop spec; crop c of row i from
    fold_in(fold_in(fold_in(key, CROP_STREAM), rows[i]), c); `rows`: the examples' indices in the global batch
    (default 0..B-1: the images are the global batch)."""
    stream = jax.random.fold_in(key, CROP_STREAM)
    rows = jnp.arange(images.shape[0]) if rows is None else rows

    def crops_of(image, row):
        k = jax.random.fold_in(stream, row)
        return [augment_crop(image, jax.random.fold_in(k, c), spec) for c, spec in enumerate(specs)]

    return jax.vmap(crops_of)(images, rows)


def block_mask(key: jax.Array, grid: tuple[int, int], target: jax.Array, attempts: int = 64,
               min_block: int = 4, max_aspect: float = 1 / 0.3) -> jax.Array:
    """A (gh*gw,) bool mask of about `target` patches made of rectangles (BEiT's block masking, as DINOv2 uses it):
    each attempt draws a block of area uniform in [min(min_block, remaining), remaining] and aspect log-uniform in
    [1/max_aspect, max_aspect], and keeps it if the mask then has at most `target` patches."""
    gh, gw = grid
    ys, xs = np.mgrid[:gh, :gw]
    ys, xs = jnp.asarray(ys), jnp.asarray(xs)

    draws = jax.random.uniform(key, (attempts, 4))  # one draw for all attempts

    def attempt(i, mask):
        u = draws[i]
        remaining = (target - mask.sum()).astype(jnp.float32)
        low = jnp.minimum(float(min_block), remaining)
        area = low + (jnp.maximum(remaining, low) - low) * u[0]
        aspect = jnp.exp(math.log(max_aspect) * (2 * u[1] - 1))
        h = jnp.clip(jnp.round(jnp.sqrt(area * aspect)), 1, gh).astype(jnp.int32)
        w = jnp.clip(jnp.round(jnp.sqrt(area / aspect)), 1, gw).astype(jnp.int32)
        top = jnp.minimum((u[2] * (gh - h + 1)).astype(jnp.int32), gh - h)
        left = jnp.minimum((u[3] * (gw - w + 1)).astype(jnp.int32), gw - w)
        block = (ys >= top) & (ys < top + h) & (xs >= left) & (xs < left + w)
        new = mask | block
        return jnp.where((remaining > 0) & (new.sum() <= target), new, mask)

    return jax.lax.fori_loop(0, attempts, attempt, jnp.zeros(grid, bool)).reshape(-1)


def ibot_masks(key: jax.Array, images: int, grid: tuple[int, int], probability: float,
               ratio: tuple[float, float]) -> jax.Array:
    """(images, gh*gw) bool masks of the global crops, as DINOv2's collate: int(images * probability) images are
    masked, the j-th of them at a ratio drawn uniformly in the j-th of the strata linspace(ratio[0], ratio[1], n+1)
    (so the ratios spread over the whole range), block-masked; which images are masked is a random permutation."""
    n_patches = grid[0] * grid[1]
    n_masked = int(images * probability)
    k_perm, k_ratio, k_block = jax.random.split(jax.random.fold_in(key, MASK_STREAM), 3)
    strata = np.linspace(ratio[0], ratio[1], n_masked + 1)
    lo = jnp.asarray(np.concatenate([strata[:-1], np.zeros(images - n_masked)]), jnp.float32)
    hi = jnp.asarray(np.concatenate([strata[1:], np.zeros(images - n_masked)]), jnp.float32)
    r = lo + (hi - lo) * jax.random.uniform(k_ratio, (images,))
    targets = (n_patches * r).astype(jnp.int32)  # 0 for the unmasked images
    masks = jax.vmap(lambda k, t: block_mask(k, grid, t))(jax.random.split(k_block, images), targets)
    return masks[jax.random.permutation(k_perm, images)]
