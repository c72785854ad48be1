"""random_erasing: how often it erases, the rectangles' area and aspect statistics, noise inside and the image
untouched outside, determinism per example, and its place in the op string."""

import numpy as np
import pytest

from vit_jax.data import pp as pp_lib
from vit_jax.data.erasing import erasing_box


def test_box_statistics():
    rng = np.random.default_rng(0)
    boxes = [erasing_box(rng, 32, 40, 0.02, 1 / 3, 0.3) for _ in range(4000)]
    assert all(b is not None for b in boxes)  # 32x40 always fits one of 10 draws
    areas = np.array([h * w / (32 * 40) for _, _, h, w in boxes])
    aspects = np.array([h / w for _, _, h, w in boxes])
    tops, lefts = np.array([t for t, _, h, _ in boxes]), np.array([t + h for t, _, h, _ in boxes])
    assert areas.min() >= 0.01 and areas.max() <= 0.4  # [0.02, 1/3] up to rounding to whole pixels
    assert abs(np.mean(areas) - (0.02 + 1 / 3) / 2) < 0.02  # uniform in area (draws that do not fit bias it low)
    assert aspects.min() >= 0.25 and aspects.max() <= 4.0  # [0.3, 1/0.3] up to rounding
    assert abs(np.mean(np.log(aspects))) < 0.05  # log-uniform, symmetric around square
    assert tops.min() == 0 and lefts.max() == 32  # boxes reach every edge, never past it
    assert erasing_box(np.random.default_rng(0), 2, 2, 0.02, 0.05, 0.3) is None  # nothing fits a 2x2 image


def test_the_op_erases_with_probability_p_and_noise_inside():
    op = pp_lib.build("value_range(-1,1)|random_erasing(0.25)")
    pixels = np.full((16, 16, 3), 255, np.uint8)  # value 1.0 everywhere after value_range
    erased, outside_changed = 0, 0
    for i in range(800):
        out = op({"image": pixels.copy()}, np.random.default_rng([7, i]))["image"]
        changed = out != 1.0
        if changed.any():
            erased += 1
            ys, xs = np.nonzero(changed.any(-1))
            box = changed[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
            assert box.all()  # one solid rectangle of noise (a draw of exactly 1.0 has probability 0)
            assert abs(out[changed].std() - 1.0) < 0.5
    assert abs(erased / 800 - 0.25) < 0.05
    again = op({"image": pixels.copy()}, np.random.default_rng([7, 3]))["image"]
    np.testing.assert_array_equal(again, op({"image": pixels.copy()}, np.random.default_rng([7, 3]))["image"])


def test_it_needs_the_float_image_and_sane_arguments():
    with pytest.raises(ValueError, match="after value_range or normalize"):
        pp_lib.build("random_erasing(1.0)")({"image": np.zeros((8, 8, 3), np.uint8)},
                                                  np.random.default_rng(0))
    with pytest.raises(ValueError, match="0 < area_min <= area_max < 1"):
        pp_lib.build("random_erasing(0.5, 0.4, 0.2)")
