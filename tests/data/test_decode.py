"""Robust decoding: build-time sanitising of every difficult kind, read-time errors and substitution."""

import io

import numpy as np
import pytest
from PIL import Image

from vit_jax.data import decode


def test_rgb_jpeg_is_kept_byte_for_byte(gen):
    data = gen.encode(gen.photo(40, 48))
    out, kind = decode.sanitize_image(data)
    assert kind == "kept" and out == data


@pytest.mark.parametrize("kind", ["converted_cmyk", "converted_grayscale", "converted_png", "skipped_corrupt",
                                  "skipped_truncated", "skipped_tiny"])
def test_each_difficult_kind_is_converted_or_skipped(gen, kind):
    data = gen.bad_images()[kind]
    out, got = decode.sanitize_image(data)
    assert got == kind
    if kind.startswith("converted"):
        img = Image.open(io.BytesIO(out))
        assert img.format == "JPEG" and img.mode == "RGB" and img.size == (48, 40)
    else:
        assert out is None


def test_converted_cmyk_keeps_the_picture(gen):
    pixels = gen.photo(40, 48, seed=1)
    out, _ = decode.sanitize_image(gen.encode(pixels, mode="CMYK", quality=95))
    assert np.abs(decode.decode_rgb(out).astype(float) - pixels).mean() < 6


def test_read_time_errors_are_decode_errors(gen):
    for bad in (gen.bad_images()["skipped_corrupt"], gen.bad_images()["skipped_truncated"], b""):
        with pytest.raises(decode.DecodeError):
            decode.decode_rgb(bad)


def test_png_named_jpeg_and_grayscale_decode_to_rgb_at_read_time(gen):
    for data in (gen.bad_images()["converted_png"], gen.bad_images()["converted_grayscale"]):
        arr = decode.decode_rgb(data)
        assert arr.shape == (40, 48, 3) and arr.dtype == np.uint8


def test_build_report_counts_and_merges():
    a, b = decode.BuildReport(), decode.BuildReport()
    a.add("kept", "x")
    a.add("skipped_corrupt", "y")
    b.add("converted_cmyk", "z")
    b.add("skipped_corrupt", "w")
    a.merge(b.to_dict())
    assert a.counts == {"kept": 1, "skipped_corrupt": 2, "converted_cmyk": 1}
    assert a.files["skipped_corrupt"] == ["y", "w"] and a.num_skipped == 2


def test_jpeg_draft_scale_never_shrinks_the_crop_below_the_output():
    assert decode.jpeg_draft_scale(300, 300, 224, 224) == 1
    assert decode.jpeg_draft_scale(448, 500, 224, 224) == 2
    assert decode.jpeg_draft_scale(4000, 3000, 224, 224) == 8
    for w in range(224, 3000, 97):
        s = decode.jpeg_draft_scale(w, w, 224, 224)
        assert w / s >= 224 and (s == 8 or w / (2 * s) < 224)


def test_opencv_jpeg_decoding_equals_pil_for_every_kind_of_jpeg(gen):
    pixels = gen.photo(40, 48, seed=2)
    variants = {"baseline": gen.encode(pixels), "progressive": gen.encode(pixels, progressive=True, quality=90),
                "4:4:4": gen.encode(pixels, subsampling=0, quality=90), "grayscale": gen.encode(pixels, mode="L"),
                "cmyk": gen.encode(pixels, mode="CMYK")}
    for name, data in variants.items():
        got = decode.decode_rgb(data)
        want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert got.shape == want.shape and got.dtype == np.uint8, name
        assert np.abs(got.astype(int) - want).max() <= (1 if name == "cmyk" else 0), name  # CMYK: rounding


def test_exif_orientation_is_ignored_like_pil_and_tensorflow(gen):
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees": OpenCV would apply it by default
    out = io.BytesIO()
    Image.fromarray(gen.photo(40, 48, seed=3)).save(out, "JPEG", exif=exif.tobytes())
    data = out.getvalue()
    np.testing.assert_array_equal(decode.decode_rgb(data), np.asarray(Image.open(io.BytesIO(data))))
    assert decode.decode_crop_resize(data, lambda w, h: (0, 0, w, h), 48, 40).shape == (40, 48, 3)


def test_fused_decode_raises_decode_errors_and_reads_every_format(gen):
    for kind, data in gen.bad_images().items():
        if kind in ("skipped_corrupt", "skipped_truncated"):
            with pytest.raises(decode.DecodeError):
                decode.decode_crop_resize(data, lambda w, h: (0, 0, w, h), 16, 16)
        else:  # CMYK, grayscale, PNG, tiny: all decode to RGB
            assert decode.decode_crop_resize(data, lambda w, h: (0, 0, w, h), 16, 16).shape == (16, 16, 3)


def test_jpeg_size_reads_the_frame_header_like_pil(gen):
    pixels = gen.photo(40, 48, seed=4)
    exif = Image.Exif()
    exif[0x010E] = "a description long enough to make the APP1 segment non-trivial" * 10
    with_exif = io.BytesIO()
    Image.fromarray(pixels).save(with_exif, "JPEG", exif=exif.tobytes())
    for data in (gen.encode(pixels), gen.encode(pixels, progressive=True, quality=90), gen.encode(pixels, mode="L"),
                 gen.encode(pixels, mode="CMYK"), with_exif.getvalue(), gen.bad_images()["skipped_truncated"]):
        assert decode.jpeg_size(data) == Image.open(io.BytesIO(data)).size == (48, 40)
    for data in (gen.encode(pixels, fmt="PNG"), b"", b"\xff\xd8", b"\xff\xd8\xff\xe0\x00",
                 gen.bad_images()["skipped_corrupt"], b"\xff\xd8\xff\xda\x00\x02"):
        assert decode.jpeg_size(data) is None


def test_plain_pngs_decode_like_pil_and_other_pngs_keep_pils_conversions(gen):
    # 8-bit gray and RGB PNGs take OpenCV's decoder: the same pixels as PIL's. Palette, alpha and 16-bit PNGs are
    # left to PIL (plain_png_size says None), and damaged PNGs are DecodeErrors either way.
    pixels = gen.photo(40, 48, seed=5)
    for mode in ("RGB", "L"):
        out = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(out, "PNG")
        data = out.getvalue()
        assert decode.plain_png_size(data) == (48, 40)
        want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        np.testing.assert_array_equal(decode.decode_rgb(data), want)
        for bad in (data[: len(data) // 2], data[:40] + bytes(len(data) - 40)):
            with pytest.raises(decode.DecodeError):
                decode.decode_rgb(bad)
    for mode in ("P", "RGBA", "LA", "I;16"):
        out = io.BytesIO()
        img = Image.fromarray(pixels).convert("L" if mode == "I;16" else mode)
        (Image.fromarray(np.asarray(img, np.uint16) * 257) if mode == "I;16" else img).save(out, "PNG")
        assert decode.plain_png_size(out.getvalue()) is None, mode
    assert decode.plain_png_size(gen.encode(pixels)) is None  # a JPEG
