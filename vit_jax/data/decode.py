"""Robust image decoding: the one place that turns stored bytes into RGB pixels.

Two users:
- build time (`sanitize_image`): every image is checked once; RGB JPEGs are kept byte for byte, everything else
  that decodes (CMYK or grayscale JPEGs, PNGs named .JPEG, palette images) is converted to an RGB JPEG once, and
  what cannot be decoded (corrupt, truncated, tiny) is skipped. The outcome of each image is a `kind` counted in
  a `BuildReport`.
- read time (`open_rgb_lazy`, `decode_rgb`, `decode_crop_resize`): any failure becomes `DecodeError`, which the
  pipeline counts and replaces with a neighbour record instead of stopping training. JPEGs are decoded by OpenCV
  (faster than PIL, identical pixels: see cv.py), and a training crop by `_jpeg_crop` (only the crop's pixels,
  identical to OpenCV's); other formats, and JPEGs these reject, go through PIL, which either decodes them or
  says why they are bad.
"""

from __future__ import annotations

import collections
import io
import json
import os
import struct
from pathlib import Path

import numpy as np
from PIL import Image

from vit_jax.data import _jpeg_crop, cv

# Everything PIL raises for bad input data (UnidentifiedImageError is an OSError; broken PNG chunks raise
# SyntaxError; some truncated headers raise struct.error or EOFError).
_PIL_DATA_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error, Image.DecompressionBombError)

KEPT = "kept"
SKIPPED_PREFIX = "skipped_"


class DecodeError(ValueError):
    """Raised when stored image bytes cannot be decoded (the pipeline substitutes another record)."""


# The pixel budget: an image with more pixels is refused before its pixels are decoded, in every path that decodes
# (training, evaluation, predict, analyses, dataset builds). A 20 KB PNG can declare 13000x13000 pixels (~0.5 GB
# as RGB, more while decoding); 100M pixels (e.g. 10000x10000) is above any real dataset image we know of.
PIXEL_BUDGET_ENV = "VIT_JAX_MAX_IMAGE_PIXELS"
DEFAULT_PIXEL_BUDGET = 100_000_000
# PIL's own guard (a warning above 89M pixels, an error above 179M) is replaced by this one, which every decode
# path checks from the image header before decoding.
Image.MAX_IMAGE_PIXELS = None


def pixel_budget() -> int:
    return int(os.environ.get(PIXEL_BUDGET_ENV) or DEFAULT_PIXEL_BUDGET)


def check_pixels(width: int, height: int) -> None:
    if width * height > pixel_budget():
        raise DecodeError(f"{width}x{height} pixels is over the pixel budget of {pixel_budget():,} "
                          f"({PIXEL_BUDGET_ENV}); a decompression bomb, or raise the budget")


def open_rgb_lazy(data: bytes) -> Image.Image:
    """Opens image bytes without decoding pixels (header only), so a JPEG draft size can still be chosen; an image
    over the pixel budget raises DecodeError here, before any pixel is decoded."""
    if not data:
        raise DecodeError("empty file (0 bytes)")
    try:
        img = Image.open(io.BytesIO(data))
    except _PIL_DATA_ERRORS as e:
        raise DecodeError(f"cannot identify image ({len(data)} bytes): {e}") from e
    check_pixels(*img.size)
    return img


# 16-bit (and 32-bit integer) single-channel modes: PIL's convert("RGB") clips them to 0..255; they are rescaled.
_WIDE_GRAY = {"I;16": 65535, "I;16B": 65535, "I;16L": 65535, "I;16N": 65535, "I": 65535}


def load_rgb(img: Image.Image) -> Image.Image:
    """Decodes the pixels of an opened image and converts them to RGB; raises DecodeError on bad data.

    16-bit grayscale is scaled to 8 bits (v * 255 / 65535, rounded), not clipped."""
    try:
        img.load()
        if img.mode in _WIDE_GRAY:
            wide = np.asarray(img, np.float64)
            gray = np.clip(np.rint(wide * (255.0 / _WIDE_GRAY[img.mode])), 0, 255).astype(np.uint8)
            return Image.fromarray(gray, "L").convert("RGB")
        return img if img.mode == "RGB" else img.convert("RGB")
    except _PIL_DATA_ERRORS as e:
        raise DecodeError(f"cannot decode {img.format} image: {e}") from e


def decode_rgb(data: bytes) -> np.ndarray:
    """Decodes JPEG/PNG/... bytes to a uint8 (H, W, 3) array."""
    if data[:2] == cv.JPEG_SOI and (size := jpeg_size(data)) is not None:
        check_pixels(*size)
        pixels = cv.decode_jpeg(data)
        if pixels is not None:
            return pixels
    elif (size := plain_png_size(data)) is not None:
        check_pixels(*size)
        pixels = cv.decode_png(data)
        if pixels is not None:
            return pixels
    return np.asarray(load_rgb(open_rgb_lazy(data)))


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def plain_png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of an 8-bit grayscale or RGB PNG, from its IHDR chunk; None for any other data.

    Those two layouts decode to the same RGB pixels in OpenCV as in PIL (gray replicated, no alpha, no palette), ~3x
    faster (37 against 107 us for a digits scan); 16-bit, palette and alpha PNGs keep PIL's conversions (16-bit is
    rescaled by load_rgb, where OpenCV would shift)."""
    if len(data) < 33 or data[:8] != _PNG_SIGNATURE or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    bit_depth, color_type = data[24], data[25]
    return (width, height) if width and height and bit_depth == 8 and color_type in (0, 2) else None


def decode_labels(data: bytes) -> np.ndarray:
    """Decodes a one-channel PNG label map (segmentation classes) to a uint8 (H, W) array, values untouched."""
    try:
        pixels = np.asarray(Image.open(io.BytesIO(data)))
    except (OSError, ValueError) as e:  # PIL's errors for truncated or unknown data
        raise DecodeError(f"segmentation map cannot be decoded: {e}") from e
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    if pixels.ndim != 2 or pixels.dtype != np.uint8:
        raise DecodeError(f"a segmentation map must be a one-channel 8-bit image, got {pixels.dtype} {pixels.shape}")
    return pixels


# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic): they carry the size.
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's frame header, reading only the marker segments before it (~2 us).

    None when the data does not start like a JPEG or its markers are malformed; PIL then has the final word.
    """
    if data[:2] != cv.JPEG_SOI:
        return None
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            pos += 2
        elif marker in _JPEG_SOF:
            if pos + 9 > end:
                return None
            height, width = (data[pos + 5] << 8) | data[pos + 6], (data[pos + 7] << 8) | data[pos + 8]
            return (width, height) if width and height else None
        elif marker in (0xD9, 0xDA):  # end of image or a scan before any frame header
            return None
        else:
            pos += 2 + ((data[pos + 2] << 8) | data[pos + 3])
    return None


def jpeg_draft_scale(crop_w: float, crop_h: float, out_w: int, out_h: int) -> int:
    """The largest JPEG DCT reduction (1, 2, 4 or 8) that still leaves the crop at least the output size.

    Decoding at 1/2, 1/4 or 1/8 scale inside libjpeg does less inverse-DCT, upsampling and colour work (the
    entropy decoding, ~60% of a full decode here, stays); as long as the crop stays at least as large as the output,
    the final resize still only shrinks, and DCT-domain downscaling is itself a good antialiasing filter.
    """
    scale = 1
    while scale < 8 and crop_w / (2 * scale) >= out_w and crop_h / (2 * scale) >= out_h:
        scale *= 2
    return scale


def decode_crop_resize(data: bytes, box_fn, out_w: int, out_h: int) -> np.ndarray:
    """Fused decode + crop + resize: a JPEG is decoded only inside the crop, at the strongest DCT reduction the
    crop allows.

    Args:
      data: encoded image bytes.
      box_fn: called once with the full image (width, height); returns the crop (x, y, w, h) in full-size pixels.
      out_w, out_h: output size.
    Returns: uint8 (out_h, out_w, 3): the crop resized by `cv.resize` (bilinear, like TF's decode_and_crop_jpeg
    followed by `tf.image.resize`). At a DCT scale s > 1 the box is rounded to whole pixels of the 1/s image.

    JPEGs go through `_jpeg_crop` (libjpeg-turbo's partial decode, as TF's decode_and_crop_jpeg; pixels identical
    to a full decode's, cropped): ~0.19 ms less per ~500x375 photo than a full decode (docs/BENCHMARKS.md). What it
    declines (errors, damaged data, CMYK) takes the full decode, which decodes or reports it.
    """
    # The header only: the size decides the crop, the crop decides the DCT scale.
    size = jpeg_size(data)
    img = open_rgb_lazy(data) if size is None else None
    width, height = size or img.size
    check_pixels(width, height)
    box = box_fn(width, height)
    if size is not None:
        scale = jpeg_draft_scale(box[2], box[3], out_w, out_h)
        x, y, w, h = scaled_box(*box, scale, -(-width // scale), -(-height // scale))  # 1/s image: ceil(W/s) wide
        if (crop := decode_jpeg_box(data, scale, x, y, w, h)) is not None:
            return cv.resize(crop, out_h, out_w)
        pixels = cv.decode_jpeg(data, scale)
        if pixels is not None:
            return cv.resize(pixels[y : y + h, x : x + w], out_h, out_w)
    # not a JPEG, or one libjpeg rejects: PIL decodes it or raises DecodeError
    x, y, w, h = box
    pixels = np.asarray(load_rgb(img or open_rgb_lazy(data)))
    return cv.resize(pixels[y : y + h, x : x + w], out_h, out_w)


def decode_jpeg_box(data: bytes, scale: int, x: int, y: int, w: int, h: int) -> np.ndarray | None:
    """Box (x, y, w, h) of the JPEG decoded at 1/scale, as uint8 (h, w, 3), decoding only that box (`_jpeg_crop`);
    None for anything libjpeg reports (errors, damaged data, CMYK, a box outside the image)."""
    crop = np.empty((h, w, 3), np.uint8)
    return crop if _jpeg_crop.decode(data, crop, scale, x, y, w, h) else None


def scaled_box(x, y, w, h, scale: int, width: int, height: int) -> tuple[int, int, int, int]:
    """The box in pixels of the 1/scale image (width x height): pixel i stands for full-size pixels [s*i, s*i + s)."""
    if scale == 1:
        return x, y, w, h
    x0, y0 = min(round(x / scale), width - 1), min(round(y / scale), height - 1)
    x1, y1 = max(x0 + 1, round((x + w) / scale)), max(y0 + 1, round((y + h) / scale))
    return x0, y0, x1 - x0, y1 - y0


def sanitize_image(data: bytes, min_side: int = 8, quality: int = 95) -> tuple[bytes | None, str]:
    """Checks one image at build time. Returns (bytes to store or None, kind).

    kind is "kept" (an RGB JPEG, stored unchanged), "converted_<why>" (re-encoded once as an RGB JPEG) or
    "skipped_<why>" (corrupt, truncated or tiny: not stored).
    """
    try:
        img = Image.open(io.BytesIO(data))
    except _PIL_DATA_ERRORS:
        return None, "skipped_corrupt"
    fmt, mode = img.format, img.mode
    if min(img.size) < min_side:
        return None, "skipped_tiny"
    if img.size[0] * img.size[1] > pixel_budget():
        return None, "skipped_too_many_pixels"
    if fmt == "JPEG" and mode == "RGB":
        # A full decode at 1/8 scale still reads every entropy-coded byte, so truncation and corruption surface,
        # at a fraction of the cost of a full-size decode.
        img.draft("RGB", (max(1, img.size[0] // 8), max(1, img.size[1] // 8)))
        try:
            img.load()
        except _PIL_DATA_ERRORS as e:
            return None, "skipped_truncated" if "truncated" in str(e) else "skipped_corrupt"
        return data, KEPT
    try:
        rgb = load_rgb(img)
    except DecodeError as e:
        return None, "skipped_truncated" if "truncated" in str(e) else "skipped_corrupt"
    if fmt != "JPEG":
        why = f"converted_{(fmt or 'unknown').lower()}"
    else:
        why = {"CMYK": "converted_cmyk", "L": "converted_grayscale"}.get(mode, f"converted_{mode.lower()}")
    out = io.BytesIO()
    rgb.save(out, "JPEG", quality=quality)
    return out.getvalue(), why


class BuildReport:
    """Counts what happened to each image during a build; written as JSON next to the prepared data."""

    MAX_LISTED = 1000  # file names listed per kind (the counts are always complete)

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.files: dict[str, list[str]] = collections.defaultdict(list)

    def add(self, kind: str, file_id: str) -> None:
        self.counts[kind] += 1
        if kind != KEPT and len(self.files[kind]) < self.MAX_LISTED:
            self.files[kind].append(file_id)

    def merge(self, other: "BuildReport | dict") -> None:
        d = other.to_dict() if isinstance(other, BuildReport) else other
        self.counts.update(d.get("counts", {}))
        for kind, names in d.get("files", {}).items():
            self.files[kind].extend(names[: self.MAX_LISTED - len(self.files[kind])])

    @property
    def num_skipped(self) -> int:
        return sum(n for k, n in self.counts.items() if k.startswith(SKIPPED_PREFIX))

    def to_dict(self) -> dict:
        return {"counts": dict(sorted(self.counts.items())), "files": {k: v for k, v in sorted(self.files.items())}}

    def write(self, path: str | Path, extra: dict | None = None) -> None:
        Path(path).write_text(json.dumps({**(extra or {}), **self.to_dict()}, indent=1))

    def summary(self) -> str:
        total = sum(self.counts.values())
        parts = ", ".join(f"{k}={n}" for k, n in sorted(self.counts.items()))
        return f"{total} images: {parts or 'none'}"
