"""Image preprocessing ops (host side, numpy + OpenCV). They read and write `example["image"]`.

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


def _size(h: int, w: int | None) -> tuple[int, int]:
    return int(h), int(h if w is None else w)


def _resize(image: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    return cv.resize(image, out_h, out_w)


def sample_inception_box(
    width: int,
    height: int,
    rng: np.random.Generator,
    area_range: tuple[float, float] = (0.05, 1.0),
    aspect_range: tuple[float, float] = (3 / 4, 4 / 3),
    attempts: int = 10,
) -> tuple[int, int, int, int]:
    """Inception-style random crop (x, y, w, h): area fraction uniform in area_range, aspect ratio log-uniform.

    Like TF's sample_distorted_bounding_box, up to `attempts` tries, then the whole image.
    """
    log_lo, log_hi = math.log(aspect_range[0]), math.log(aspect_range[1])
    for _ in range(attempts):
        area = rng.uniform(*area_range) * width * height
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(area * aspect)))
        h = int(round(math.sqrt(area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            x = int(rng.integers(0, width - w + 1))
            y = int(rng.integers(0, height - h + 1))
            return x, y, w, h
    return 0, 0, width, height


@register("decode")
def make_decode() -> Op:
    """Decodes image bytes (JPEG, PNG, ...) to uint8 RGB."""

    def op(ex: Example, rng: np.random.Generator) -> Example:
        return {**ex, "image": decode.decode_rgb(ex["image"])}

    return op


@register("decode_jpeg_and_inception_crop")
def make_decode_jpeg_and_inception_crop(size: int, area_min: float = 5, area_max: float = 100, w: int | None = None) -> Op:
    """Fused decode + Inception crop + resize to size (x w): JPEG DCT scaling decodes fewer pixels when it can.

    area_min/area_max are percentages of the image area; the aspect ratio range is 3/4..4/3.
    """
    out_h, out_w = _size(size, w)
    area = (area_min / 100, area_max / 100)

    def op(ex: Example, rng: np.random.Generator) -> Example:
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
        return {**ex, "image": _resize(image[y : y + ch, x : x + cw], out_h, out_w)}

    return op


@register("resize")
def make_resize(h: int, w: int | None = None) -> Op:
    """Resizes to (h, w) (square if w is omitted), ignoring the aspect ratio."""
    out_h, out_w = _size(h, w)
    return lambda ex, rng: {**ex, "image": _resize(_pixels(ex, "resize"), out_h, out_w)}


@register("resize_small")
def make_resize_small(size: int) -> Op:
    """Resizes so the shorter side is `size`, keeping the aspect ratio."""

    def op(ex: Example, rng: np.random.Generator) -> Example:
        image = _pixels(ex, "resize_small")
        h, w = image.shape[:2]
        ratio = size / min(h, w)
        return {**ex, "image": _resize(image, max(1, round(h * ratio)), max(1, round(w * ratio)))}

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
        return {**ex, "image": image[y : y + out_h, x : x + out_w]}

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
        return {**ex, "image": image[y : y + out_h, x : x + out_w]}

    return op


@register("flip_lr")
def make_flip_lr(p: float = 0.5) -> Op:
    """Mirrors the image left-right with probability p."""

    def op(ex: Example, rng: np.random.Generator) -> Example:
        if rng.uniform() >= p:
            return ex
        # A contiguous copy (OpenCV's mirror: ~6 us at 224x224): a negative-stride view would slow later ops.
        return {**ex, "image": cv.flip_lr(_pixels(ex, "flip_lr"))}

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
