"""Preprocessing ops for clips (an example's `image` as (T, H, W, 3) uint8 frames), as in ViViT/scenic's video
pipelines: decode the stored frames, sample a clip in time (frame stride, a random temporal crop in training, the
central one in evaluation) and crop every frame of it at the same place. The ops that work per pixel (value_range,
normalize) take clips as they are.

`decode_clip(16)|sample_clip(8, stride=2)|random_crop_clip(28)|value_range(-1, 1)|onehot(40)`

Randomness comes from the example's own generator (pp.py), so a clip is the same for the same (seed, position)
whatever the number of processes or workers.
"""

from __future__ import annotations

import numpy as np

from vit_jax.data import decode
from vit_jax.data.pp import Example, Op, register


def _clip(ex: Example, op: str) -> np.ndarray:
    clip = ex["image"]
    if isinstance(clip, (bytes, np.bytes_)) or np.ndim(clip) != 4:
        raise ValueError(f"op {op} needs a decoded clip (frames, height, width, channels): put `decode_clip` "
                         "before it in the op string")
    return clip


@register("decode_clip")
def make_decode_clip(frames: int) -> Op:
    """Decodes a clip stored as one image of its `frames` frames stacked vertically (moving_digits) into
    (frames, H, W, 3) uint8."""

    def op(ex: Example, rng: np.random.Generator) -> Example:
        strip = decode.decode_rgb(ex["image"])
        if strip.shape[0] % frames:
            raise ValueError(f"decode_clip({frames}): the stored image has {strip.shape[0]} rows, not a multiple of "
                             f"{frames} frames")
        return {**ex, "image": strip.reshape(frames, strip.shape[0] // frames, *strip.shape[1:])}

    return op


@register("sample_clip")
def make_sample_clip(frames: int, stride: int = 1, random: bool = True) -> Op:
    """`frames` frames `stride` apart: from a uniformly drawn start (a random temporal crop; `random=True`, for
    training) or from the start that centres them (evaluation). A clip shorter than the span is looped, as scenic's
    sampling does for short videos."""
    if frames < 1 or stride < 1:
        raise ValueError(f"sample_clip({frames}, stride={stride}): frames and stride must be positive")
    span = (frames - 1) * stride + 1

    def op(ex: Example, rng: np.random.Generator) -> Example:
        clip = _clip(ex, "sample_clip")
        extra = clip.shape[0] - span
        if extra >= 0:
            start = int(rng.integers(0, extra + 1)) if random else extra // 2
            index = start + stride * np.arange(frames)
        else:
            index = (stride * np.arange(frames)) % clip.shape[0]
        return {**ex, "image": np.ascontiguousarray(clip[index])}

    return op


def _crop(ex: Example, h: int, w: int | None, random: bool, rng: np.random.Generator, op: str) -> Example:
    clip = _clip(ex, op)
    w = h if w is None else w
    if clip.shape[1] < h or clip.shape[2] < w:
        raise ValueError(f"{op}({h}, {w}) on frames of {clip.shape[1:3]}: they are smaller than the crop")
    if random:
        y, x = int(rng.integers(0, clip.shape[1] - h + 1)), int(rng.integers(0, clip.shape[2] - w + 1))
    else:
        y, x = (clip.shape[1] - h) // 2, (clip.shape[2] - w) // 2
    return {**ex, "image": np.ascontiguousarray(clip[:, y:y + h, x:x + w])}


@register("random_crop_clip")
def make_random_crop_clip(h: int, w: int | None = None) -> Op:
    """Crops the same uniformly placed (h, w) window out of every frame."""
    return lambda ex, rng: _crop(ex, h, w, True, rng, "random_crop_clip")


@register("central_crop_clip")
def make_central_crop_clip(h: int, w: int | None = None) -> Op:
    """Crops the central (h, w) window of every frame."""
    return lambda ex, rng: _crop(ex, h, w, False, rng, "central_crop_clip")
