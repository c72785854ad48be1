"""The Swin family: names and config errors, pinned sizes, the shifted-window mask, the family seam and FLOPs."""

import numpy as np
import pytest

from tests.models.xla_cost import xla_flops_per_image
from vit_jax.models.build import build_model, describe, model_flops
from vit_jax.models.config import ModelConfigError
from vit_jax.models.swin import relative_position_index, shifted_window_mask
from vit_jax.models.swin_config import SwinConfig, swin_config
from vit_jax.train.config import ConfigError, default_config, model_config

# Parameter counts of timm's swin_{tiny,small,base,large}_patch4_window7_224 (1000 classes), counted from the models
# timm builds; FLOPs (multiply-adds) of the paper's Table 1: 4.5G, 8.7G, 15.4G, 34.5G at 224 px and 47.0G for Swin-B
# at 384 px (window 12).
SIZES = {"Swin-T": (28_288_354, 4.5e9), "Swin-S": (49_606_258, 8.7e9), "Swin-B": (87_768_224, 15.4e9),
         "Swin-L": (196_532_476, 34.5e9)}


def matmul_flops(cfg) -> float:
    """The paper counts the matrix products only; our count adds the element-wise work XLA counts (GELU's erf)."""
    flops = model_flops(cfg)
    return flops.forward - flops.breakdown["elementwise"]


@pytest.mark.parametrize("name", SIZES)
def test_named_sizes_have_timms_parameter_counts_and_the_papers_flops(name):
    cfg = swin_config(name, num_classes=1000)
    assert cfg.name == name
    params, macs = SIZES[name]
    assert build_model(cfg).num_params() == params
    assert matmul_flops(cfg) / 2 == pytest.approx(macs, rel=0.01)


def test_swin_b_at_384_with_window_12():
    cfg = swin_config("Swin-B", num_classes=1000, image_size=384, window_size=12)
    assert matmul_flops(cfg) / 2 == pytest.approx(47.0e9, rel=0.01)
    assert [cfg.stage_window(s) for s in range(4)] == [((12, 12), (6, 6))] * 3 + [((12, 12), (0, 0))]


def test_custom_names_and_config_errors():
    cfg = swin_config("Swin-64-2-2", num_classes=10, image_size=32)
    assert (cfg.embed_dim, cfg.depths, cfg.num_heads, cfg.name) == (64, (2, 2), (2, 4), "Swin-64-2-2")
    assert swin_config("Swin-32-2-2", num_heads=(2, 2), image_size=32).name == "Swin-32-2-2 (heads 2-2)"
    with pytest.raises(ModelConfigError, match="unknown Swin model 'Swin-X'"):
        swin_config("Swin-X")
    with pytest.raises(ModelConfigError, match="must be a positive multiple of 32x32"):
        swin_config("Swin-T", image_size=200)
    with pytest.raises(ModelConfigError, match="stage 1 has 96 channels, which num_heads=5 does not divide"):
        SwinConfig(num_heads=(5, 6, 12, 24))
    with pytest.raises(ModelConfigError, match="one entry per stage"):
        SwinConfig(num_heads=(3, 6))
    with pytest.raises(ModelConfigError, match=r"drop_path=1.0 must be in \[0, 1\)"):
        SwinConfig(drop_path=1.0)


def test_shifted_window_mask_separates_the_regions_the_roll_brings_together():
    # A 6x6 grid in 3x3 windows, shifted by 1: region rows/columns are [0..2], [3..4], [5] after the roll.
    mask = shifted_window_mask((6, 6), (3, 3), (1, 1))
    assert mask.shape == (4, 9, 9) and set(np.unique(mask)) == {0.0, -100.0}
    assert not mask[0].any()  # the first window lies inside one region
    last = mask[3]  # tokens (r, c) of the last window; rows 0-1 come from region 1, row 2 from region 2 (wrapped)
    region = np.array([[4, 4, 5], [4, 4, 5], [7, 7, 8]]).reshape(-1)
    assert np.array_equal(last == 0, region[:, None] == region[None, :])
    index = relative_position_index((2, 3))  # offsets (dh, dw) -> (dh + 1) * 5 + (dw + 2)
    assert index[0, 0] == 1 * 5 + 2 and index[0, 5] == 0 * 5 + 0 and index[5, 0] == 2 * 5 + 4


def test_the_family_seam_builds_describes_and_checks_keys():
    c = default_config()
    c.model.variant, c.model.image_size = "Swin-T", 224
    cfg = model_config(c, 10)
    assert isinstance(cfg, SwinConfig) and cfg.num_classes == 10 and cfg.window_size == 7
    assert describe(cfg).startswith("Swin-T (embed 96, depths 2-2-6-2, heads 3-6-12-24, window 7")
    c.model.window_size, c.model.image_size = 12, 384
    assert model_config(c, 10).window_size == 12
    c.model.pool = "map"
    with pytest.raises(ConfigError, match=r"Swin-T is a Swin model, which has no model.pool"):
        model_config(c, 10)


def test_flops_match_xla_cost_analysis_within_2_percent():
    # 40 px, patch 4, window 3: a 10x10 grid padded to 12x12 with shifted windows, then 5x5 padded to 6x6.
    cfg = swin_config("Swin-32-2-2", num_classes=10, image_size=40, window_size=3)
    flops = xla_flops_per_image(build_model(cfg), cfg.image_size)
    assert flops == pytest.approx(model_flops(cfg).forward, rel=0.02)
