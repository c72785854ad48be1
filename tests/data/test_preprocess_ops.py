"""Op strings and ops: parsing errors, golden comparisons against PIL / TensorFlow, label ops, RandAugment."""

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


def test_decode_matches_pil_and_tensorflow(gen):
    import tensorflow as tf

    data = gen.encode(gen.photo(60, 80, seed=3))
    got = run("decode", {"image": data})["image"]
    np.testing.assert_array_equal(got, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    ref = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
    assert np.abs(got.astype(int) - ref).max() <= 2  # same libjpeg algorithm; upsampling rounding may differ


def test_resize_crop_ops_match_pil_reference(gen):
    pixels = gen.photo(60, 80, seed=4)
    pil = Image.fromarray(pixels)
    ex = {"image": pixels}
    np.testing.assert_array_equal(run("resize(30, 40)", ex)["image"],
                                  np.asarray(pil.resize((40, 30), Image.Resampling.BILINEAR)))
    small = run("resize_small(30)", ex)["image"]
    np.testing.assert_array_equal(small, np.asarray(pil.resize((40, 30), Image.Resampling.BILINEAR)))
    np.testing.assert_array_equal(run("central_crop(20, 30)", ex)["image"], pixels[20:40, 25:55])
    crop = run("random_crop(16)", ex, seed=5)["image"]
    hits = [(y, x) for y in range(45) for x in range(65) if np.array_equal(pixels[y:y + 16, x:x + 16], crop)]
    assert len(hits) == 1


def test_fused_inception_crop_equals_crop_then_resize(gen):
    # Output 64 on a 120-pixel-high image: no crop is 2x the output, so no DCT scaling, so exact PIL equality.
    data = gen.encode(gen.photo(120, 160, seed=5))
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    for seed in range(5):
        got = run("decode_jpeg_and_inception_crop(64)", {"image": data}, seed)["image"]
        x, y, w, h = image_ops.sample_inception_box(160, 120, np.random.default_rng(seed))
        # PIL's box resize (the filter may read just outside the box, unlike resizing a cut-out crop).
        ref = np.asarray(Image.fromarray(full).resize((64, 64), Image.Resampling.BILINEAR, box=(x, y, x + w, y + h)))
        np.testing.assert_array_equal(got, ref)


def test_fused_crop_with_dct_scaling_stays_close_to_tensorflow(gen):
    import tensorflow as tf
    from sklearn.datasets import load_sample_images

    data = gen.encode(load_sample_images().images[0], quality=95)  # a real 427x640 photo
    for box, scale in (((40, 30, 576, 384), 4), ((0, 0, 200, 150), 2)):
        assert image_ops.decode.jpeg_draft_scale(box[2], box[3], 64, 64) == scale
        got = image_ops.decode.decode_crop_resize(data, lambda w, h: box, 64, 64)
        crop = tf.image.decode_and_crop_jpeg(data, [box[1], box[0], box[3], box[2]], channels=3)
        ref = tf.image.resize(tf.cast(crop, tf.float32), (64, 64), antialias=True).numpy()
        # DCT-domain downscaling differs from an antialiased resize by ~1% of the value range, no more.
        assert np.abs(got.astype(float) - ref).mean() < 2.5


def test_inception_box_respects_area_and_aspect_ranges():
    rng = np.random.default_rng(0)
    for _ in range(300):
        x, y, w, h = image_ops.sample_inception_box(200, 150, rng, (0.05, 1.0))
        assert 0 <= x and x + w <= 200 and 0 <= y and y + h <= 150
        if (w, h) != (200, 150):
            assert 0.045 <= w * h / 30000 <= 1.0
            assert 3 / 4 - 0.05 <= w / h <= 4 / 3 + 0.05


def test_flip_value_range_normalize():
    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) * 10
    flipped = run("flip_lr(p=1.0)", {"image": pixels})["image"]
    np.testing.assert_array_equal(flipped, pixels[:, ::-1])
    assert run("flip_lr(p=0.0)", {"image": pixels})["image"] is pixels
    vr = run("value_range(-1, 1)", {"image": np.array([[[0, 255, 51]]], np.uint8)})["image"]
    assert vr.dtype == np.float32 and np.allclose(vr, [[[-1.0, 1.0, -0.6]]])
    norm = run("normalize((10, 20, 30), (2, 4, 5))", {"image": np.array([[[12, 24, 35]]], np.uint8)})["image"]
    np.testing.assert_allclose(norm, [[[1.0, 1.0, 1.0]]])


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
