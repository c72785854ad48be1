"""The OpenCV pixel kernels of the input pipeline: JPEG and plain PNG decoding, resizing and mirroring of uint8 images.

OpenCV is used where it is measurably faster than PIL on the host (see docs/BENCHMARKS.md, "Data pipeline"):
`cv2.imdecode` decodes a JPEG ~20% faster than PIL (same libjpeg-turbo algorithm, bit-identical pixels) and
straight into an RGB numpy array, its bilinear resize is ~6x faster than PIL's antialiased one, and its mirror
~10x faster than PIL's. Its calls release the GIL, so the pipeline's worker threads run them in parallel.

OpenCV's own thread pool is switched off once, on import: the pipeline already runs one worker thread per core,
and nested pools would only oversubscribe the cores.
"""

from __future__ import annotations

import cv2
import numpy as np

cv2.setNumThreads(1)

# IMREAD_REDUCED_COLOR_k asks libjpeg for DCT-domain scaling by 1/k (it decodes k times fewer pixels per side);
# those flags include IMREAD_COLOR (BGR), swapped here for RGB. EXIF orientation is ignored, like PIL and TF do.
# IMREAD_COLOR_RGB first shipped in OpenCV 4.11.0 (absent from 4.10.0's wheels), hence setup.py's lower bound.
_RGB = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
_DECODE_FLAGS = {
    1: _RGB,
    2: (cv2.IMREAD_REDUCED_COLOR_2 & ~cv2.IMREAD_COLOR) | _RGB,
    4: (cv2.IMREAD_REDUCED_COLOR_4 & ~cv2.IMREAD_COLOR) | _RGB,
    8: (cv2.IMREAD_REDUCED_COLOR_8 & ~cv2.IMREAD_COLOR) | _RGB,
}
JPEG_SOI = b"\xff\xd8"


def decode_jpeg(data: bytes, scale: int = 1) -> np.ndarray | None:
    """Decodes JPEG bytes to uint8 RGB (H, W, 3), at 1/scale size (scale 1, 2, 4 or 8: ceil(W/scale) wide).

    Returns None when OpenCV cannot decode the data (corrupt or truncated: OpenCV treats a premature end of the
    data as an error), so that the caller can report the error through its own (PIL) path.
    """
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), _DECODE_FLAGS[scale])
    if pixels is None or pixels.ndim != 3 or pixels.shape[2] != 3:
        return None
    return pixels


def decode_png(data: bytes) -> np.ndarray | None:
    """Decodes 8-bit grayscale or RGB PNG bytes to uint8 RGB (H, W, 3); None when OpenCV rejects the data."""
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), _RGB)
    if pixels is None or pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
        return None
    return pixels


def resize(image: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Bilinear resize of a uint8 or float32 (H, W[, C]) image, any row stride (a crop view needs no copy).

    Below 2x reduction (and for enlargements): half-pixel centres and edge replication, the sampling of
    `tf.image.resize(..., "bilinear", antialias=False)` (uint8 results within one level: OpenCV interpolates uint8
    in fixed point). Each output pixel blends two neighbours per axis, so beyond 2x some source pixels would be
    skipped (aliasing), hence:
    - a side reduced 2x to 4x is first resized bilinearly to twice its output size, then halved by averaging
      pixel pairs (a bilinear 2x reduction): every source pixel contributes, at ~2.5x the cost of one bilinear
      pass, and most of the way to a full area filter's quality (`INTER_AREA` costs ~8x);
    - a reduction of 4x or more (no side enlarged) uses `INTER_AREA`.
    The fused JPEG crop rarely needs either: DCT scaling leaves less than 2x on one side, hence less than 2.7x on
    the other (aspect ratio at most 4/3).
    """
    h, w = image.shape[:2]
    if (h, w) == (out_h, out_w):
        return image
    if h >= 4 * out_h or w >= 4 * out_w:
        if h >= out_h and w >= out_w:
            out = cv2.resize(image, (out_w, out_h), interpolation=cv2.INTER_AREA)
            return out.reshape((out_h, out_w) + image.shape[2:])  # OpenCV drops a trailing channel axis of 1
    kh, kw = (2 if h >= 2 * out_h else 1), (2 if w >= 2 * out_w else 1)
    out = cv2.resize(image, (out_w * kw, out_h * kh), interpolation=cv2.INTER_LINEAR)
    if kh * kw > 1:
        out = cv2.resize(out, (out_w, out_h), interpolation=cv2.INTER_LINEAR)  # exact halving: pair means
    return out.reshape((out_h, out_w) + image.shape[2:])


def resize_nearest(labels: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Nearest-neighbour resize of an (H, W) label map, with half-pixel centres (the sampling grid of `resize`, so
    a label map stays aligned with its image): labels are never blended into values that mean another class."""
    if labels.shape[:2] == (out_h, out_w):
        return labels
    return cv2.resize(labels, (out_w, out_h), interpolation=cv2.INTER_NEAREST_EXACT).reshape(
        (out_h, out_w) + labels.shape[2:])


def lookup(image: np.ndarray, table: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
    """table[image] for a uint8 image (H, W[, C]) and a float32 table of 256 values (or (256, C): per channel).

    One pass over the pixels with OpenCV's LUT: ~55 us at 224x224x3 into a cache-cold batch row, against ~80 us for
    numpy's multiply-then-add, and the values are the table's, so a table computed with numpy gives numpy's exact
    results. Writes into `out` (float32, the image's shape) if given. Returns None for layouts OpenCV cannot
    handle in place (the caller then computes with numpy).
    """
    channels = 1 if image.ndim == 2 else image.shape[2]
    if (image.dtype != np.uint8 or image.ndim not in (2, 3) or channels not in (1, 3, 4) or image.shape[-1] == 1
            or table.dtype != np.float32 or table.shape[0] != 256 or table.size // 256 not in (1, channels)):
        return None
    if out is None:
        out = np.empty(image.shape, np.float32)
    elif out.shape != image.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        return None
    result = cv2.LUT(image, table.reshape(256, 1, table.size // 256), dst=out)
    return out if result is out else None


def flip_lr(image: np.ndarray) -> np.ndarray:
    """A contiguous left-right mirror of an (H, W[, C]) array."""
    if image.dtype in (np.uint8, np.float32) and (image.ndim == 2 or (image.ndim == 3 and image.shape[2] <= 4)):
        return cv2.flip(image, 1).reshape(image.shape)
    return np.ascontiguousarray(image[:, ::-1])
