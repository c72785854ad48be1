"""The cropped JPEG decode (vit_jax/data/_jpeg_crop.c): every pixel equals the full decode's, cropped, for the JPEG
layouts photos come in, at every DCT scale; what it declines goes through the full decode's path."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from vit_jax.data import _jpeg_crop, cv, decode

# (chroma subsampling: 2 = 4:2:0, 1 = 4:2:2, 0 = 4:4:4; progressive; PIL mode)
LAYOUTS = [(2, False, "RGB"), (1, False, "RGB"), (0, False, "RGB"), (2, True, "RGB"), (0, True, "RGB"),
           (2, False, "L")]


def encode(gen, pixels: np.ndarray, layout: tuple[int, bool, str]) -> bytes:
    subsampling, progressive, mode = layout
    return gen.encode(pixels, mode=mode, quality=90, subsampling=subsampling, progressive=progressive)


def random_box(rng, width: int, height: int) -> tuple[int, int, int, int]:
    w, h = int(rng.integers(1, width + 1)), int(rng.integers(1, height + 1))
    return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: f"sub{t[0]}-{'prog' if t[1] else 'base'}-{t[2]}")
def test_every_pixel_equals_the_full_decode_cropped(gen, layout):
    # Odd sizes leave partial iMCUs at the right and bottom; random boxes start on and off iMCU boundaries (a
    # box starting on one is where fancy upsampling needs the pixel of context the decoder adds).
    rng = np.random.default_rng(0)
    for width, height in ((131, 97), (80, 64), (33, 47)):
        data = encode(gen, gen.photo(height, width, seed=width), layout)
        for scale in (1, 2, 4, 8):
            full = cv.decode_jpeg(data, scale)
            boxes = [random_box(rng, full.shape[1], full.shape[0]) for _ in range(40)]
            boxes += [(0, 0, full.shape[1], full.shape[0]), (16, 16, 1, 1), (full.shape[1] - 1, 0, 1, full.shape[0])]
            for x, y, w, h in boxes:
                if x + w > full.shape[1] or y + h > full.shape[0]:
                    continue
                out = np.empty((h, w, 3), np.uint8)
                assert _jpeg_crop.decode(data, out, scale, x, y, w, h), (width, height, scale, (x, y, w, h))
                np.testing.assert_array_equal(out, full[y : y + h, x : x + w], err_msg=f"{scale} {(x, y, w, h)}")


def test_declines_what_it_should_leave_to_the_full_decode(gen):
    pixels = gen.photo(40, 48, seed=1)
    out = np.empty((40, 48, 3), np.uint8)
    plain, cmyk, bad = gen.encode(pixels), gen.encode(pixels, mode="CMYK"), gen.bad_images()
    truncated = bad["skipped_truncated"]
    for data, box in ((cmyk, (0, 0, 48, 40)), (truncated, (0, 0, *Image.open(io.BytesIO(truncated)).size)),
                      (bad["skipped_corrupt"], (0, 0, 8, 8)), (b"", (0, 0, 8, 8)),
                      (plain, (40, 0, 9, 8)), (plain, (0, 0, 0, 8))):
        assert _jpeg_crop.decode(data, out, 1, *box) is False
    with pytest.raises(ValueError, match="scale must be 1, 2, 4 or 8"):
        _jpeg_crop.decode(plain, out, 3, 0, 0, 8, 8)
    with pytest.raises(ValueError, match="a 48x40 RGB box needs 5760"):
        _jpeg_crop.decode(plain, out[:20], 1, 0, 0, 48, 40)
    with pytest.raises(TypeError):
        _jpeg_crop.decode(plain, bytes(out), 1, 0, 0, 8, 8)  # read-only output


def test_fused_op_pixels_equal_a_full_decode_then_crop_and_resize(gen):
    # decode_crop_resize's JPEG path against the full-frame decode it replaced, box for box, scales included.
    rng = np.random.default_rng(1)
    for layout in LAYOUTS:
        data = encode(gen, gen.photo(97, 131, seed=7), layout)
        for _ in range(20):
            box = random_box(rng, 131, 97)
            scale = decode.jpeg_draft_scale(box[2], box[3], 16, 16)
            x, y, w, h = decode.scaled_box(*box, scale, -(-131 // scale), -(-97 // scale))
            want = cv.resize(cv.decode_jpeg(data, scale)[y : y + h, x : x + w], 16, 16)
            np.testing.assert_array_equal(decode.decode_crop_resize(data, lambda w_, h_: box, 16, 16), want)
