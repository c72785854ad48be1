"""three_augment (DeiT III): one of grayscale / solarize / blur per image, uniformly; each does what it says; colour
jitter on top; deterministic per example; uint8 input only."""

import collections

import numpy as np
import pytest

from vit_jax.data import pp as pp_lib
from vit_jax.data.three_augment import CHOICES

RNG = np.random.default_rng(0)
IMAGE = np.concatenate([RNG.integers(0, 256, (16, 8, 3)), np.full((16, 8, 3), 200)], axis=1).astype(np.uint8)


def kind(out: np.ndarray) -> str:
    """Which of the three an output (without jitter) came from, read off the pixels."""
    if (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all():
        return "grayscale"
    if (out[:, 8:] == 55).all():  # the flat half: 200 >= 128 inverted to 55; blur keeps a flat area flat
        return "solarize"
    return "blur"


def test_each_transform_uniformly_and_what_it_does():
    op = pp_lib.build("three_augment(0.0)")
    counts = collections.Counter()
    for i in range(600):
        out = op({"image": IMAGE.copy()}, np.random.default_rng([1, i]))["image"]
        assert out.shape == IMAGE.shape and out.dtype == np.uint8
        k = kind(out)
        counts[k] += 1
        if k == "solarize":
            np.testing.assert_array_equal(out, np.where(IMAGE >= 128, 255 - IMAGE, IMAGE))
        if k == "blur":  # smoother: neighbouring pixels of the noisy half closer on average
            assert np.abs(np.diff(out[:, :8].astype(int), axis=1)).mean() < np.abs(
                np.diff(IMAGE[:, :8].astype(int), axis=1)).mean()
    assert set(counts) == set(CHOICES) and all(abs(n / 600 - 1 / 3) < 0.07 for n in counts.values())


def test_jitter_and_determinism():
    op = pp_lib.build("three_augment(0.3)")
    plain = pp_lib.build("three_augment(0.0)")
    a = op({"image": IMAGE.copy()}, np.random.default_rng(5))["image"]
    np.testing.assert_array_equal(a, op({"image": IMAGE.copy()}, np.random.default_rng(5))["image"])
    jittered = sum(not np.array_equal(op({"image": IMAGE.copy()}, np.random.default_rng(i))["image"],
                                      plain({"image": IMAGE.copy()}, np.random.default_rng(i))["image"])
                   for i in range(20))
    assert jittered >= 18  # the same transform draw, then a brightness/contrast/saturation change


def test_input_errors():
    with pytest.raises(ValueError, match="uint8 RGB image"):
        pp_lib.build("three_augment")({"image": IMAGE.astype(np.float32)}, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"jitter strength in \[0, 1\)"):
        pp_lib.build("three_augment(1.5)")
