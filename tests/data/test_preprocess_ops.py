"""Op strings and ops: parsing errors, golden comparisons against TensorFlow (and PIL), label ops, RandAugment."""

import io
import math

import numpy as np
import pytest
from PIL import Image

from vit_jax.data import image_ops, pp, randaug


def run(ops: str, ex: dict, seed: int = 0) -> dict:
    return pp.build(ops)(dict(ex), np.random.default_rng(seed))


def test_unknown_op_lists_known_ops():
    with pytest.raises(ValueError, match=r"unknown preprocessing op 'resise'.*known ops: .*resize_small"):
        pp.build("decode|resise(3)")


def test_bad_arguments_and_non_literals_are_clear_errors():
    with pytest.raises(ValueError, match=r"bad arguments in 'central_crop\(1, 2, 3\)'.*central_crop\(h, w=None\)"):
        pp.build("central_crop(1, 2, 3)")
    with pytest.raises(ValueError, match="literals"):
        pp.build("resize(os.getpid())")


def test_every_documented_op_is_registered():
    expected = {"decode", "decode_jpeg_and_inception_crop", "inception_crop", "resize", "resize_small",
                "central_crop", "random_crop", "flip_lr", "randaug", "value_range", "normalize", "onehot",
                "multihot", "keep", "drop"}
    assert expected <= set(pp.known_ops())


def test_a_config_adds_its_own_op_module_by_name(tmp_path, monkeypatch):
    (tmp_path / "my_ops.py").write_text(
        "from vit_jax.data.pp import register\n\n"
        "@register('times_two_for_test')\n"
        "def times_two(key='x'):\n"
        "    return lambda ex, rng: {**ex, key: ex[key] * 2}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="unknown preprocessing op 'times_two_for_test'"):
        pp.build("times_two_for_test")
    pp.load_modules(["my_ops"])
    assert run("times_two_for_test|times_two_for_test", {"x": 3})["x"] == 12
    with pytest.raises(pp.UnknownOpModule, match=r"'my_opz' \(data.pp_modules\) cannot be imported"):
        pp.load_modules(["my_opz"])


def test_decode_matches_pil_and_tensorflow(gen):
    import tensorflow as tf

    data = gen.encode(gen.photo(60, 80, seed=3))
    got = run("decode", {"image": data})["image"]
    np.testing.assert_array_equal(got, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    ref = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
    assert np.abs(got.astype(int) - ref).max() <= 2  # same libjpeg algorithm; upsampling rounding may differ


def test_resize_ops_match_tensorflow_bilinear(gen):
    import tensorflow as tf

    pixels = gen.photo(60, 80, seed=4)
    ex = {"image": pixels}

    def tf_bilinear(h, w, antialias=False):
        return tf.image.resize(pixels, (h, w), antialias=antialias).numpy()

    # Shrinking by less than 2x, enlarging, and exactly 2x (both give the 2x2 mean): TF's non-antialiased
    # bilinear (half-pixel centres), within one uint8 level (OpenCV's fixed point).
    for h, w in ((45, 50), (90, 100), (30, 40), (40, 80), (40, 41)):
        got = run(f"resize({h}, {w})", ex)["image"]
        assert got.shape == (h, w, 3) and got.dtype == np.uint8
        assert np.abs(got - np.round(tf_bilinear(h, w))).max() <= 1, (h, w)
    np.testing.assert_array_equal(run("resize_small(30)", ex)["image"], run("resize(30, 40)", ex)["image"])
    # Shrinking by 2x or more reads every source pixel instead of aliasing: close to TF's antialiased resize.
    for h, w in ((25, 30), (20, 25), (15, 35)):
        got = run(f"resize({h}, {w})", ex)["image"]
        assert np.abs(got - tf_bilinear(h, w, antialias=True)).mean() < 2.5, (h, w)
    # 4x or more: area means (here exact 4x4 block means).
    blocks = pixels.reshape(15, 4, 20, 4, 3).mean(axis=(1, 3))
    assert np.abs(run("resize(15, 20)", ex)["image"] - blocks).max() <= 0.5 + 1e-6
    stripes = np.zeros((60, 90, 3), np.uint8)
    stripes[:, ::2] = 255  # 1-pixel stripes: bilinear sampling at 1/3 picks single stripes, full contrast
    assert np.ptp(tf.image.resize(stripes, (20, 30), antialias=False).numpy()) == 255
    assert np.ptp(run("resize(20, 30)", {"image": stripes})["image"]) <= 128  # 2x bilinear, then pair means
    assert np.ptp(run("resize(15, 22)", {"image": stripes})["image"]) <= 6  # 4x: area means
    # float32 images and single-channel images keep their dtype and shape.
    as_float = run("value_range(0, 1)|resize(45, 50)", ex)["image"]
    assert as_float.dtype == np.float32 and np.abs(as_float * 255 - tf_bilinear(45, 50)).max() < 1e-3
    assert run("resize(45, 50)", {"image": pixels[..., :1]})["image"].shape == (45, 50, 1)


def test_crop_ops_cut_windows(gen):
    pixels = gen.photo(60, 80, seed=4)
    ex = {"image": pixels}
    np.testing.assert_array_equal(run("central_crop(20, 30)", ex)["image"], pixels[20:40, 25:55])
    crop = run("random_crop(16)", ex, seed=5)["image"]
    hits = [(y, x) for y in range(45) for x in range(65) if np.array_equal(pixels[y:y + 16, x:x + 16], crop)]
    assert len(hits) == 1


def test_fused_inception_crop_matches_tensorflow_decode_and_crop(gen):
    import tensorflow as tf

    # Output 64 on a 120-pixel-high image: no crop is 2x the output, so no DCT scaling.
    data = gen.encode(gen.photo(120, 160, seed=5))
    full = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()  # libjpeg's default IDCT
    bilinear = 0
    for seed in range(8):
        got = run("decode_jpeg_and_inception_crop(64)", {"image": data}, seed)["image"]
        x, y, w, h = image_ops.sample_inception_box(160, 120, np.random.default_rng(seed))
        crop = full[y : y + h, x : x + w]
        # The fused op is exactly the unfused decode, crop and resize.
        np.testing.assert_array_equal(got, run("resize(64)", {"image": crop})["image"])
        if w < 128 and h < 128:  # single bilinear pass: TF's crop decode + resize(antialias=False)
            bilinear += 1
            assert np.abs(got - np.round(tf.image.resize(crop, (64, 64)).numpy())).max() <= 1
            # TF's fused crop decode upsamples chroma differently at the crop's edges only.
            ref = tf.image.resize(tf.image.decode_and_crop_jpeg(data, [y, x, h, w], channels=3,
                                                                dct_method="INTEGER_ACCURATE"), (64, 64)).numpy()
            assert np.abs(got - ref).mean() < 0.5
    assert bilinear >= 5


def test_fused_crop_with_dct_scaling_matches_tensorflow(gen):
    import tensorflow as tf
    from sklearn.datasets import load_sample_images

    data = gen.encode(load_sample_images().images[0], quality=95)  # a real 427x640 photo
    for box, scale, compare_full_size in (((40, 30, 576, 384), 4, True), ((0, 0, 200, 150), 2, True),
                                          ((101, 33, 130, 140), 2, False)):
        assert image_ops.decode.jpeg_draft_scale(box[2], box[3], 64, 64) == scale
        got = image_ops.decode.decode_crop_resize(data, lambda w, h: box, 64, 64)
        assert got.shape == (64, 64, 3) and got.dtype == np.uint8
        # The box is rounded to the pixel grid of the 1/scale image (pixel i = full-size pixels [s*i, s*i + s)).
        x0, y0, x1, y1 = (round(v / scale) for v in (box[0], box[1], box[0] + box[2], box[1] + box[3]))
        # libjpeg's DCT scaling through TF, then TF's crop and bilinear resize: the same pixels within one level.
        small = tf.io.decode_jpeg(data, channels=3, ratio=scale, dct_method="INTEGER_ACCURATE")[y0:y1, x0:x1]
        if max(small.shape[0], small.shape[1]) < 128:  # (2x reductions also average; see the resize test)
            assert np.abs(got - np.round(tf.image.resize(small, (64, 64)).numpy())).max() <= 1, box
        if compare_full_size:
            # Quality: DCT-domain downscaling differs from a full-size decode and an antialiased resize of the
            # same box by ~1% of the value range, no more.
            full = tf.image.decode_and_crop_jpeg(
                data, [y0 * scale, x0 * scale, (y1 - y0) * scale, (x1 - x0) * scale], channels=3)
            ref = tf.image.resize(tf.cast(full, tf.float32), (64, 64), antialias=True).numpy()
            assert np.abs(got.astype(float) - ref).mean() < 2.5, box


def test_fused_crop_of_non_jpeg_images_goes_through_pil(gen):
    pixels = gen.photo(60, 80, seed=6)
    png = gen.encode(pixels, fmt="PNG")
    got = image_ops.decode.decode_crop_resize(png, lambda w, h: (10, 5, 40, 30), 20, 20)
    np.testing.assert_array_equal(got, run("resize(20)", {"image": pixels[5:35, 10:50]})["image"])


def test_inception_box_respects_area_and_aspect_ranges():
    rng = np.random.default_rng(0)
    for _ in range(300):
        x, y, w, h = image_ops.sample_inception_box(200, 150, rng, (0.05, 1.0))
        assert 0 <= x and x + w <= 200 and 0 <= y and y + h <= 150
        if (w, h) != (200, 150):
            assert 0.045 <= w * h / 30000 <= 1.0
            assert 3 / 4 - 0.05 <= w / h <= 4 / 3 + 0.05


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    points = np.concatenate([a, b])
    cdf = lambda s: np.searchsorted(np.sort(s), points, side="right") / len(s)  # noqa: E731
    return float(np.abs(cdf(a) - cdf(b)).max())


def test_inception_box_is_distributed_like_tensorflow():
    import tensorflow as tf

    n = 3000

    @tf.function
    def tf_boxes(width, height, area_range):
        def one(seed):  # big_vision's call: no boxes, whole image as the object, min_object_covered 0
            begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
                [height, width, 3], tf.zeros([0, 0, 4]), seed=seed, min_object_covered=0.0,
                aspect_ratio_range=(3 / 4, 4 / 3), area_range=area_range, max_attempts=100,
                use_image_if_no_bounding_boxes=True)
            return tf.stack([begin[1], begin[0], size[1], size[0]])

        return tf.map_fn(one, tf.stack([tf.range(n), tf.range(n) * 7 + 1], 1), fn_output_signature=tf.int32)

    # A landscape image, and a narrow one whose crops are limited by its width rather than by the area range.
    for width, height in ((200, 150), (60, 300)):
        ref = tf_boxes(width, height, (0.05, 1.0)).numpy().T
        ours = np.array([image_ops.sample_inception_box(width, height, np.random.default_rng(i))
                         for i in range(n)]).T
        for name, a, b in (("x", ref[0], ours[0]), ("y", ref[1], ours[1]), ("w", ref[2], ours[2]),
                           ("h", ref[3], ours[3]), ("area", ref[2] * ref[3], ours[2] * ours[3]),
                           ("aspect", ref[2] / ref[3], ours[2] / ours[3])):
            # 0.05 is the 0.1% critical value for two samples of 3000; a log-uniform aspect ratio or a uniform
            # area (the earlier sampler) is off by more than 0.1.
            assert ks_distance(a, b) < 0.05, (width, height, name)
        for x, y, w, h in (ref, ours):  # TF's offset range: a crop shorter than the image never reaches its bottom
            assert (y + h < height)[h < height].all() and (x + w < width)[w < width].all()
    # No crop of 90%+ of the area fits a 10x200 image at these aspect ratios: both fall back to the whole image.
    assert (tf_boxes(10, 200, (0.9, 1.0)).numpy() == [0, 0, 10, 200]).all()
    assert image_ops.sample_inception_box(10, 200, np.random.default_rng(0), (0.9, 1.0)) == (0, 0, 10, 200)


def test_flip_value_range_normalize():
    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) * 10
    flipped = run("flip_lr(p=1.0)", {"image": pixels})["image"]
    np.testing.assert_array_equal(flipped, pixels[:, ::-1])
    for other in (pixels[..., :1], pixels[..., 0], pixels.astype(np.float32), pixels.astype(np.int16)):
        np.testing.assert_array_equal(run("flip_lr(p=1.0)", {"image": other})["image"], other[:, ::-1])
    assert run("flip_lr(p=0.0)", {"image": pixels})["image"] is pixels
    vr = run("value_range(-1, 1)", {"image": np.array([[[0, 255, 51]]], np.uint8)})["image"]
    assert vr.dtype == np.float32 and np.allclose(vr, [[[-1.0, 1.0, -0.6]]])
    norm = run("normalize((10, 20, 30), (2, 4, 5))", {"image": np.array([[[12, 24, 35]]], np.uint8)})["image"]
    np.testing.assert_allclose(norm, [[[1.0, 1.0, 1.0]]])


def test_value_range_and_normalize_give_numpys_float32_arithmetic_for_every_layout():
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((6, 7, 3), (6, 7), (6, 7, 1), (6, 7, 4))]
    images += [images[0][:, ::2], images[0].astype(np.float32) / 3]  # a strided view, a float image
    for image in images:
        want = np.multiply(image, np.float32(2 / 255), dtype=np.float32) + np.float32(-1)
        np.testing.assert_array_equal(run("value_range(-1, 1)", {"image": image})["image"], want)
        want = np.multiply(image, np.float32(0.5 / 190), dtype=np.float32) + np.float32(-10 * 0.5 / 190)
        np.testing.assert_array_equal(run("value_range(0, 0.5, 10, 200)", {"image": image})["image"], want)
        if image.ndim == 3 and image.shape[2] == 3:
            mean, std = np.float32([120, 115, 100]), np.float32([60, 61, 62])
            want = (image.astype(np.float32) - mean) * (np.float32(1) / std)
            np.testing.assert_array_equal(run("normalize((120, 115, 100), (60, 61, 62))", {"image": image})["image"],
                                          want)


def test_onehot_smoothing_multihot_keep_drop():
    ex = {"label": 2, "labels": [0, 3], "id": b"x", "image": np.zeros((1, 1, 3), np.uint8)}
    np.testing.assert_array_equal(run("onehot(4)", ex)["labels"], [0, 0, 1, 0])
    np.testing.assert_allclose(run("onehot(4, smoothing=0.1)", ex)["labels"], [0.025, 0.025, 0.925, 0.025])
    np.testing.assert_allclose(run("onehot(4, on=0.9, off=0.1)", ex)["labels"], [0.1, 0.1, 0.9, 0.1])
    np.testing.assert_array_equal(run("multihot(5)", ex)["labels"], [1, 0, 0, 1, 0])
    assert set(run("keep('image', 'label')", ex)) == {"image", "label"}
    assert set(run("drop('id')", ex)) == {"image", "label", "labels"}
    with pytest.raises(ValueError, match="out of range"):
        run("onehot(2)", ex)


def test_ops_need_decoded_image():
    with pytest.raises(ValueError, match="needs a decoded image"):
        run("resize(8)", {"image": b"\xff\xd8"})


@pytest.mark.parametrize("name", randaug.OP_NAMES)
def test_each_randaugment_op_changes_the_image_deterministically(gen, name):
    pixels = gen.photo(32, 32, seed=7)
    img = Image.fromarray(pixels)
    a = np.asarray(randaug.OPS[name](img, 10, np.random.default_rng(1)))
    b = np.asarray(randaug.OPS[name](img, 10, np.random.default_rng(1)))
    assert a.shape == pixels.shape and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, pixels), f"{name} at magnitude 10 left the image unchanged"


def test_randaug_op_string_is_reproducible_per_example_rng(gen):
    pixels = gen.photo(32, 32, seed=8)
    outs = [run("randaug(2, 10)", {"image": pixels}, seed)["image"] for seed in (3, 3, 4)]
    np.testing.assert_array_equal(outs[0], outs[1])
    assert outs[0].shape == (32, 32, 3) and outs[0].dtype == np.uint8
    changed = sum(not np.array_equal(run("randaug(2, 10)", {"image": pixels}, s)["image"], pixels) for s in range(20))
    assert changed >= 10  # each layer fires with probability ~0.5
    assert math.isfinite(float(outs[2].mean()))
