"""Preprocessing ops for clips (an example's `image` as (T, H, W, 3) uint8 frames), as in ViViT/scenic's video
pipelines: decode the stored frames, sample a clip in time (frame stride, a random temporal crop in training, the
central one in evaluation), resize and crop every frame of it at the same place. The ops that work per pixel
(value_range, normalize) take clips as they are.

Multi-view evaluation (ViViT's 4 temporal x 3 spatial views, scenic's num_test_clips and do_three_spatial_crops):
`sample_clip(..., random=False, views=4)` takes 4 evenly spaced clips and `three_crop_clip(224)` three windows along
each frame's longer side, so an example's `image` becomes (views, T, H, W, 3) (4 x 3 = 12 views); every op between
them works on the views alike, and the eval step averages the model's logits over them (eval/steps.py).

Two stored layouts:
- one image of the frames stacked vertically (moving_digits): `decode_clip(16)|sample_clip(8, stride=2)|...`;
- a TFDS `Video` feature (ucf101, kinetics-style builders: one encoded image per frame, under the feature's name,
  e.g. `video`): `sample_clip(8, stride=2, key="video")|decode_frames("video")|resize_small_clip(128)|...` samples
  the encoded frames first, so only the clip's frames are decoded.

`decode_clip(16)|sample_clip(8, stride=2)|random_crop_clip(28)|value_range(-1, 1)|onehot(40)`

Randomness comes from the example's own generator (pp.py), so a clip is the same for the same (seed, position)
whatever the number of processes or workers.
"""

from __future__ import annotations

import numpy as np

from vit_jax.data import cv, decode
from vit_jax.data.image_ops import small_side_size
from vit_jax.data.pp import Example, Op, register


def _clip(clip, op: str) -> np.ndarray:
    """`clip` (an example's `image`) as a decoded (T, H, W, C) clip or (V, T, H, W, C) views of one, or a one-line
    error naming the missing op."""
    if _is_encoded_frames(clip) or _is_encoded_views(clip):
        raise ValueError(f"op {op} needs decoded frames: put `decode_frames` before it in the op string")
    if isinstance(clip, (bytes, np.bytes_)) or np.ndim(clip) not in (4, 5):
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


def _is_encoded_frames(value) -> bool:
    """A sequence of encoded frames (a TFDS Video feature as the parser reads it), not a decoded clip."""
    if isinstance(value, (list, tuple)):
        return bool(value) and isinstance(value[0], (bytes, np.bytes_))
    return isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "SO"


def _is_encoded_views(value) -> bool:
    """Views of encoded frames (`sample_clip(..., views=V)` before `decode_frames`): a list of V frame sequences."""
    return isinstance(value, list) and bool(value) and _is_encoded_frames(value[0])


def _decode_frames(stored, key: str) -> np.ndarray:
    frames = [decode.decode_rgb(bytes(f)) for f in stored]
    if len({f.shape for f in frames}) != 1:
        raise decode.DecodeError(f"decode_frames({key!r}): frames of different sizes "
                                 f"{sorted({f.shape for f in frames})}")
    return np.stack(frames)


@register("decode_frames")
def make_decode_frames(key: str = "image") -> Op:
    """Decodes the encoded frames of `example[key]` (a TFDS `Video` feature: one JPEG/PNG per frame) into the
    example's `image`, (T, H, W, 3) uint8, or (V, T, H, W, 3) for the views `sample_clip(..., views=V)` picked; `key`
    is dropped when it is not `image`. A frame that does not decode makes the record bad (DecodeError: the pipeline
    substitutes and counts it); frames of different sizes too."""

    def op(ex: Example, rng: np.random.Generator) -> Example:
        stored = ex.get(key)
        if isinstance(stored, np.ndarray) and stored.ndim == 4:  # already decoded (TFDS's own parser decodes them)
            clip = stored
        elif stored is not None and _is_encoded_frames(stored):
            clip = _decode_frames(stored, key)
        elif stored is not None and _is_encoded_views(stored):
            frames = _decode_frames([f for view in stored for f in view], key)  # every view has the same length
            clip = frames.reshape(len(stored), -1, *frames.shape[1:])
        else:
            raise ValueError(f"decode_frames({key!r}): the example has no sequence of encoded frames under {key!r} "
                             f"(keys: {', '.join(sorted(ex))})")
        return {**{k: v for k, v in ex.items() if k != key}, "image": clip}

    return op


@register("sample_clip")
def make_sample_clip(frames: int, stride: int = 1, random: bool = True, key: str = "image", views: int = 1) -> Op:
    """`frames` frames `stride` apart: from a uniformly drawn start (a random temporal crop; `random=True`, for
    training) or from the start that centres them (evaluation). A clip shorter than the span is looped, as scenic's
    sampling does for short videos. It samples a decoded clip, or (before `decode_frames`) a sequence of encoded
    frames under `key`, so that only the sampled frames are decoded.

    `views` > 1 (evaluation only): that many clips with evenly spaced starts, the first at the video's first frame
    and the last ending at its last (DMVR's linspace sampling, scenic's num_test_clips), stacked as (views, T, H, W,
    C) (before `decode_frames`: a list of `views` frame sequences). A video shorter than the span gives `views`
    copies of its looped clip."""
    if frames < 1 or stride < 1 or views < 1:
        raise ValueError(f"sample_clip({frames}, stride={stride}, views={views}): frames, stride and views must be "
                         "positive")
    if views > 1 and random:
        raise ValueError(f"sample_clip(views={views}) takes evenly spaced evaluation views: give random=False")
    span = (frames - 1) * stride + 1

    def op(ex: Example, rng: np.random.Generator) -> Example:
        stored = ex.get(key)
        encoded = _is_encoded_frames(stored)
        clip = stored if encoded else _clip(stored, "sample_clip")
        if not encoded and clip.ndim == 5:
            raise ValueError("sample_clip on views of a clip: sample once, with views=")
        count = len(clip)
        if count == 0:
            raise decode.DecodeError("sample_clip: the video has no frames")
        extra = count - span
        if extra < 0:
            starts = np.zeros(views, np.int64)
        elif views > 1:
            starts = np.linspace(0, extra, views).astype(np.int64)  # truncated, as DMVR's int cast
        else:
            starts = np.array([int(rng.integers(0, extra + 1)) if random else extra // 2])
        index = (starts[:, None] + stride * np.arange(frames)) % count  # the modulo loops a short video only
        picked = [[clip[i] for i in row] for row in index] if encoded else np.ascontiguousarray(clip[index])
        if views == 1:
            picked = picked[0]
        return {**ex, key: picked}

    return op


@register("resize_small_clip")
def make_resize_small_clip(size: int) -> Op:
    """Resizes every frame so its shorter side is `size`, keeping the aspect ratio (scenic's short-side resize)."""
    if size < 1:
        raise ValueError(f"resize_small_clip({size}): give a positive size")

    def op(ex: Example, rng: np.random.Generator) -> Example:
        clip = _clip(ex["image"], "resize_small_clip")
        return {**ex, "image": _resize_frames(clip, *small_side_size(*clip.shape[-3:-1], size))}

    return op


@register("resize_clip")
def make_resize_clip(h: int, w: int | None = None) -> Op:
    """Resizes every frame to (h, w) (square if w is omitted), bilinearly, ignoring the aspect ratio."""
    w = h if w is None else w
    if h < 1 or w < 1:
        raise ValueError(f"resize_clip({h}, {w}): give a positive size")

    return lambda ex, rng: {**ex, "image": _resize_frames(_clip(ex["image"], "resize_clip"), h, w)}


def _resize_frames(clip: np.ndarray, h: int, w: int) -> np.ndarray:
    """Every frame (of every view) resized bilinearly to (h, w); the clip itself when it already has that size."""
    if clip.shape[-3:-1] == (h, w):
        return clip
    frames = np.stack([cv.resize(frame, h, w) for frame in clip.reshape(-1, *clip.shape[-3:])])
    return frames.reshape(*clip.shape[:-3], *frames.shape[1:])


def _crop(ex: Example, h: int, w: int | None, random: bool, rng: np.random.Generator, op: str) -> Example:
    clip = _clip(ex["image"], op)
    w = h if w is None else w
    fh, fw = clip.shape[-3:-1]
    if fh < h or fw < w:
        raise ValueError(f"{op}({h}, {w}) on frames of {(fh, fw)}: they are smaller than the crop")
    if random:
        y, x = int(rng.integers(0, fh - h + 1)), int(rng.integers(0, fw - w + 1))
    else:
        y, x = (fh - h) // 2, (fw - w) // 2
    return {**ex, "image": np.ascontiguousarray(clip[..., y:y + h, x:x + w, :])}


@register("random_crop_clip")
def make_random_crop_clip(h: int, w: int | None = None) -> Op:
    """Crops the same uniformly placed (h, w) window out of every frame."""
    return lambda ex, rng: _crop(ex, h, w, True, rng, "random_crop_clip")


@register("central_crop_clip")
def make_central_crop_clip(h: int, w: int | None = None) -> Op:
    """Crops the central (h, w) window of every frame."""
    return lambda ex, rng: _crop(ex, h, w, False, rng, "central_crop_clip")


@register("three_crop_clip")
def make_three_crop_clip(size: int) -> Op:
    """Three (size, size) windows of every frame, at the start, the centre and the end of its longer side (centred
    on the shorter): ViViT's three spatial views for evaluation (scenic's do_three_spatial_crops, after a short-side
    resize to `size` or more). A clip (T, H, W, C) becomes (3, T, size, size, C); views (V, T, ...) become (3V, ...),
    each temporal view's three crops together."""
    if size < 1:
        raise ValueError(f"three_crop_clip({size}): give a positive size")

    def op(ex: Example, rng: np.random.Generator) -> Example:
        clip = _clip(ex["image"], "three_crop_clip")
        views = clip if clip.ndim == 5 else clip[None]
        fh, fw = clip.shape[-3:-1]
        if min(fh, fw) < size:
            raise ValueError(f"three_crop_clip({size}) on frames of {(fh, fw)}: they are smaller than the crop")
        long_side = max(fh, fw)
        offsets = (0, (long_side - size) // 2, long_side - size)
        y0, x0 = (fh - size) // 2, (fw - size) // 2
        corners = [(o, x0) if fh > fw else (y0, o) for o in offsets]
        crops = np.stack([views[:, :, y:y + size, x:x + size] for y, x in corners], axis=1)  # (V, 3, T, s, s, C)
        return {**ex, "image": np.ascontiguousarray(crops.reshape(-1, *crops.shape[2:]))}

    return op
