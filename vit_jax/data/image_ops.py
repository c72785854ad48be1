"""Image preprocessing ops (host side, numpy + OpenCV). They read and write `example["image"]`, and the ops that
move pixels (resizes, crops, flips) move a per-pixel label map `example["segmentation"]` (see `decode_mask`) the
same way: the same box, the same coin flip, nearest-neighbour resizing, so that image and labels stay aligned.

Decoded images are uint8 (H, W, 3) arrays until `value_range`/`normalize` turn them into float32. Resizing is
OpenCV's bilinear with half-pixel centres, the sampling of `tf.image.resize(antialias=False)` that big_vision's
ops use, made to read every source pixel when an image shrinks by 2x or more (see cv.resize).
"""

from __future__ import annotations

import math

import numpy as np

from vit_jax.data import cv, decode
from vit_jax.data.pp import IMAGE_OUT, Example, Op, register


def _pixels(example: Example, op: str) -> np.ndarray:
    image = example["image"]
    if isinstance(image, (bytes, np.bytes_)):
        raise ValueError(f"op {op} needs a decoded image: put `decode` (or a decode_* op) before it in the op string")
    return image


MASK = "segmentation"  # the per-pixel label map, (H, W) uint8, of segmentation examples


def _moved(ex: Example, image: np.ndarray, move_mask, op: str) -> Example:
    """`ex` with the new image, and its label map (if any) moved by move_mask(mask) (same geometry, no blending)."""
    out = {**ex, "image": image}
    if MASK in ex:
        mask = ex[MASK]
        if not isinstance(mask, np.ndarray):
            raise ValueError(f"op {op} moves pixels but the segmentation map is not decoded yet: put `decode_mask` "
                             "before it in the op string")
        if mask.shape[:2] != ex["image"].shape[:2]:
            raise ValueError(f"op {op}: segmentation map {mask.shape[:2]} and image {ex['image'].shape[:2]} differ "
                             "in size")
        out[MASK] = move_mask(mask)
    return out


def _size(h: int, w: int | None) -> tuple[int, int]:
    return int(h), int(h if w is None else w)


def _resize(image: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    return cv.resize(image, out_h, out_w)


def _tf_crop_at_aspect(width: int, height: int, area_range: tuple[float, float], aspect: float,
                       rng: np.random.Generator) -> tuple[int, int, int, int] | None:
    """One attempt of TF's GenerateRandomCrop (sample_distorted_bounding_box_op.cc) at a given aspect ratio w/h.

    The height is a uniform integer between the heights of the smallest and the largest allowed area (the largest
    also limited so that round(h * aspect) fits the width, and by the image height); the width is round(h * aspect),
    with one pixel of height more (or less) when rounding leaves the area range. None when no such box fits.
    Python's round() is round-half-to-even like TF's lrintf; TF's float32 arithmetic may differ in the last bit.
    """
    min_area, max_area = area_range[0] * width * height, area_range[1] * width * height
    h = round(math.sqrt(min_area / aspect))
    max_h = round(math.sqrt(max_area / aspect))
    if round(max_h * aspect) > width:
        max_h = int((width + 0.5 - 1e-7) / aspect)
        if round(max_h * aspect) > width:
            max_h -= 1
    max_h = min(max_h, height)
    h = min(h, max_h)
    if h < max_h:
        h += int(rng.integers(0, max_h - h + 1))
    w = round(h * aspect)
    if w * h < min_area:
        h += 1
        w = round(h * aspect)
    if w * h > max_area:
        h -= 1
        w = round(h * aspect)
    if not (min_area <= w * h <= max_area and 0 < w <= width and 0 < h <= height):
        return None
    # TF draws offsets from [0, H - h) and [0, W - w): a crop smaller than the image never touches the bottom or
    # right edge. Kept, so that crops are distributed exactly as in big_vision.
    y = int(rng.integers(0, height - h)) if h < height else 0
    x = int(rng.integers(0, width - w)) if w < width else 0
    return x, y, w, h


def sample_inception_box(
    width: int,
    height: int,
    rng: np.random.Generator,
    area_range: tuple[float, float] = (0.05, 1.0),
    aspect_range: tuple[float, float] = (3 / 4, 4 / 3),
    attempts: int = 100,
) -> tuple[int, int, int, int]:
    """Inception-style random crop (x, y, w, h), distributed as TF's sample_distorted_bounding_box draws it.

    That is the op big_vision's inception crops call (no boxes, use_image_if_no_bounding_boxes, min_object_covered
    0, max_attempts 100). Per attempt the aspect ratio w/h is uniform (not log-uniform) in aspect_range, then the
    height is a uniform integer over the heights whose area fits area_range (so the area is not uniform: small
    crops are rarer than with a uniform area); see _tf_crop_at_aspect. After `attempts` failed attempts, the whole
    image. The same generator state always gives the same box.
    """
    for _ in range(attempts):
        box = _tf_crop_at_aspect(width, height, area_range, rng.uniform(*aspect_range), rng)
        if box is not None:
            return box
    return 0, 0, width, height


@register("decode")
def make_decode() -> Op:
    """Decodes image bytes (JPEG, PNG, ...) to uint8 RGB."""

    def op(ex: Example, rng: np.random.Generator) -> Example:
        return {**ex, "image": decode.decode_rgb(ex["image"])}

    return op


@register("decode_mask")
def make_decode_mask(key: str = MASK, offset: int = 0) -> Op:
    """Decodes a per-pixel label map stored as a one-channel PNG in example[key] to (H, W) uint8, as
    example["segmentation"] (which the resize, crop and flip ops then move with the image). `offset` is added to
    every label (e.g. -1 for oxford_iiit_pet's trimaps, stored as 1..3); a result outside 0..254 becomes 255, a
    label the segmentation objective ignores."""

    def op(ex: Example, rng: np.random.Generator) -> Example:
        if key not in ex:
            raise ValueError(f"decode_mask: the example has no '{key}' (it has {', '.join(sorted(ex))})")
        labels = decode.decode_labels(ex[key])
        if offset:
            shifted = labels.astype(np.int16) + offset
            labels = np.where((shifted >= 0) & (shifted < 255), shifted, 255).astype(np.uint8)
        out = {k: v for k, v in ex.items() if k != key}
        out[MASK] = labels
        return out

    return op


@register("decode_jpeg_and_inception_crop")
def make_decode_jpeg_and_inception_crop(size: int, area_min: float = 5, area_max: float = 100, w: int | None = None) -> Op:
    """Fused decode + Inception crop + resize to size (x w): JPEG DCT scaling decodes fewer pixels when it can.

    area_min/area_max are percentages of the image area; the aspect ratio range is 3/4..4/3.
    """
    out_h, out_w = _size(size, w)
    area = (area_min / 100, area_max / 100)

    def op(ex: Example, rng: np.random.Generator) -> Example:
        if MASK in ex:
            raise ValueError("decode_jpeg_and_inception_crop cannot crop a segmentation map with the image: use "
                             "decode|decode_mask|inception_crop(...)")
        image = decode.decode_crop_resize(
            ex["image"], lambda width, height: sample_inception_box(width, height, rng, area), out_w, out_h
        )
        return {**ex, "image": image}

    return op


@register("inception_crop")
def make_inception_crop(size: int, area_min: float = 5, area_max: float = 100, w: int | None = None) -> Op:
    """Inception crop of an already decoded image, resized to size (x w)."""
    out_h, out_w = _size(size, w)
    area = (area_min / 100, area_max / 100)

    def op(ex: Example, rng: np.random.Generator) -> Example:
        image = _pixels(ex, "inception_crop")
        x, y, cw, ch = sample_inception_box(image.shape[1], image.shape[0], rng, area)
        return _moved(ex, _resize(image[y : y + ch, x : x + cw], out_h, out_w),
                      lambda m: cv.resize_nearest(m[y : y + ch, x : x + cw], out_h, out_w), "inception_crop")

    return op


@register("resize")
def make_resize(h: int, w: int | None = None) -> Op:
    """Resizes to (h, w) (square if w is omitted), ignoring the aspect ratio."""
    out_h, out_w = _size(h, w)
    return lambda ex, rng: _moved(ex, _resize(_pixels(ex, "resize"), out_h, out_w),
                                  lambda m: cv.resize_nearest(m, out_h, out_w), "resize")


def small_side_size(h: int, w: int, size: int) -> tuple[int, int]:
    """(h, w) scaled so the shorter side is `size`, the aspect ratio kept (rounded, at least 1)."""
    ratio = size / min(h, w)
    return max(1, round(h * ratio)), max(1, round(w * ratio))


@register("resize_small")
def make_resize_small(size: int) -> Op:
    """Resizes so the shorter side is `size`, keeping the aspect ratio."""

    def op(ex: Example, rng: np.random.Generator) -> Example:
        image = _pixels(ex, "resize_small")
        out_h, out_w = small_side_size(*image.shape[:2], size)
        return _moved(ex, _resize(image, out_h, out_w), lambda m: cv.resize_nearest(m, out_h, out_w),
                      "resize_small")

    return op


@register("central_crop")
def make_central_crop(h: int, w: int | None = None) -> Op:
    """Crops the central (h, w) window (the image must be at least that large)."""
    out_h, out_w = _size(h, w)

    def op(ex: Example, rng: np.random.Generator) -> Example:
        image = _pixels(ex, "central_crop")
        y, x = (image.shape[0] - out_h) // 2, (image.shape[1] - out_w) // 2
        if y < 0 or x < 0:
            raise ValueError(f"central_crop({out_h}, {out_w}) on a {image.shape[:2]} image: resize first")
        window = (slice(y, y + out_h), slice(x, x + out_w))
        return _moved(ex, image[window], lambda m: m[window], "central_crop")

    return op


@register("random_crop")
def make_random_crop(h: int, w: int | None = None) -> Op:
    """Crops a uniformly placed (h, w) window."""
    out_h, out_w = _size(h, w)

    def op(ex: Example, rng: np.random.Generator) -> Example:
        image = _pixels(ex, "random_crop")
        if image.shape[0] < out_h or image.shape[1] < out_w:
            raise ValueError(f"random_crop({out_h}, {out_w}) on a {image.shape[:2]} image: resize first")
        y = int(rng.integers(0, image.shape[0] - out_h + 1))
        x = int(rng.integers(0, image.shape[1] - out_w + 1))
        window = (slice(y, y + out_h), slice(x, x + out_w))
        return _moved(ex, image[window], lambda m: m[window], "random_crop")

    return op


@register("flip_lr")
def make_flip_lr(p: float = 0.5) -> Op:
    """Mirrors the image left-right with probability p."""

    def op(ex: Example, rng: np.random.Generator) -> Example:
        if rng.uniform() >= p:
            return ex
        # A contiguous copy (OpenCV's mirror: ~6 us at 224x224): a negative-stride view would slow later ops.
        return _moved(ex, cv.flip_lr(_pixels(ex, "flip_lr")), cv.flip_lr, "flip_lr")

    return op


def _float_output(ex: Example, shape: tuple[int, ...]) -> np.ndarray | None:
    """The destination the pipeline offers for this example's float32 image (pp.IMAGE_OUT), if it fits."""
    out = ex.get(IMAGE_OUT)
    if out is not None and out.shape == shape and out.dtype == np.float32:
        return out
    return None


def _with_image(ex: Example, image: np.ndarray) -> Example:
    out = {k: v for k, v in ex.items() if k != IMAGE_OUT}
    out["image"] = image
    return out


@register("value_range")
def make_value_range(lo: float = -1.0, hi: float = 1.0, in_min: float = 0.0, in_max: float = 255.0) -> Op:
    """Maps pixel values linearly from [in_min, in_max] to [lo, hi], as float32."""
    scale = np.float32((hi - lo) / (in_max - in_min))
    offset = np.float32(lo - in_min * (hi - lo) / (in_max - in_min))

    def affine(image: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        out = np.multiply(image, scale, out=out, dtype=np.float32)
        out += offset
        return out

    table = affine(np.arange(256, dtype=np.uint8), None)  # uint8 images: the same arithmetic, looked up

    def op(ex: Example, rng: np.random.Generator) -> Example:
        image = _pixels(ex, "value_range")
        out = _float_output(ex, image.shape)
        looked_up = cv.lookup(image, table, out)
        return _with_image(ex, affine(image, out) if looked_up is None else looked_up)

    return op


@register("normalize")
def make_normalize(mean: float | tuple = 0.0, std: float | tuple = 1.0) -> Op:
    """(image - mean) / std per channel, as float32, on the image's current value scale."""
    mean_a = np.asarray(mean, np.float32)
    inv_std = np.float32(1.0) / np.asarray(std, np.float32)

    def affine(image: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        out = np.subtract(image, mean_a, out=out, dtype=np.float32)
        out *= inv_std
        return out

    # uint8 images: the same arithmetic, looked up (per channel when mean or std are).
    values = np.arange(256, dtype=np.uint8).reshape((256,) + (1,) * max(mean_a.ndim, inv_std.ndim))
    table = affine(values, None) if max(mean_a.ndim, inv_std.ndim) <= 1 else None

    def op(ex: Example, rng: np.random.Generator) -> Example:
        image = _pixels(ex, "normalize")
        out = _float_output(ex, np.broadcast_shapes(image.shape, mean_a.shape, inv_std.shape))
        looked_up = None if table is None else cv.lookup(image, table, out)
        return _with_image(ex, affine(image, out) if looked_up is None else looked_up)

    return op
