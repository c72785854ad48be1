"""Analytic FLOPs: the ViT paper's Table 6 compute and XLA's own count of the compiled forward pass."""

import csv
from importlib import resources

import pytest

from tests.models.xla_cost import xla_flops_per_image
from vit_jax.models import vit_config
from vit_jax.models.bit_config import bit_config
from vit_jax.models.flops import bit_flops, vit_flops
from vit_jax.models.vit import FunctionalViT

JFT_IMAGES = 300e6  # JFT-300M, nominal size per epoch


def _table6():
    text = resources.files("vit_jax.resources").joinpath("vit_table6.csv").read_text()
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


def test_b16_forward_flops():
    f = vit_flops(vit_config("B/16", num_classes=0, image_size=224))
    assert f.forward == pytest.approx(35.1e9, rel=0.005)  # the README's number


# One row disagrees with its own 14-epoch twin: R50x1+ViT-L/16 at 7 epochs is printed as 859 exaFLOPs, but the
# 14-epoch row (1668) is within 1.3% of twice our count, and 1668 / 2 = 834 (test below): the 7-epoch figure is the
# paper's inconsistency, not ours.
PAPER_OUTLIER = ("R50x1+ViT-L/16", "7")


@pytest.mark.parametrize("row", [r for r in _table6() if r["family"] != "ResNet" and (r["model"], r["epochs"]) !=
                                 PAPER_OUTLIER], ids=lambda r: r["model"] + "@" + r["epochs"])
def test_reproduces_paper_table6_exaflops(row):
    variant = row["model"].replace("ViT-", "")
    cfg = vit_config(variant, num_classes=0, image_size=224)
    exaflops = vit_flops(cfg).train * JFT_IMAGES * int(row["epochs"]) / 1e18
    assert exaflops == pytest.approx(float(row["pretrain_exaflops"]), rel=0.013)  # the README says within 1.3%


def test_paper_r50_l16_seven_epoch_row_is_not_half_its_fourteen_epoch_row():
    rows = {(r["model"], r["epochs"]): float(r["pretrain_exaflops"]) for r in _table6()}
    seven, fourteen = rows[PAPER_OUTLIER], rows[("R50x1+ViT-L/16", "14")]
    assert seven / (fourteen / 2) - 1 > 0.025  # 3.0% above half the 14-epoch compute; every other row is within 1.3%


@pytest.mark.parametrize("row", [r for r in _table6() if r["family"] == "ResNet"],
                         ids=lambda r: r["model"] + "@" + r["epochs"])
def test_reproduces_paper_table6_exaflops_of_bit_resnets(row):
    cfg = bit_config("BiT-R" + row["model"].removeprefix("ResNet"), num_classes=0, image_size=224)
    exaflops = bit_flops(cfg).train * JFT_IMAGES * int(row["epochs"]) / 1e18
    # Our count is 2-3% above the paper's for every BiT row (the README says within 3.1%).
    assert exaflops == pytest.approx(float(row["pretrain_exaflops"]), rel=0.031)


def test_table6_has_every_row_of_the_paper():
    rows = _table6()
    assert len(rows) == 18
    assert {f: sum(r["family"] == f for r in rows) for f in ("ViT", "ResNet", "Hybrid")} == \
        {"ViT": 6, "ResNet": 7, "Hybrid": 5}
    r200 = next(r for r in rows if r["model"] == "ResNet200x3")
    assert (r200["epochs"], r200["pretrain_exaflops"], r200["imagenet_top1"]) == ("14", "3306", "87.22")
    hybrid = next(r for r in rows if r["model"] == "R50x1+ViT-B/32")
    assert (hybrid["pretrain_exaflops"], hybrid["imagenet_real_top1"], hybrid["flowers_top1"]) == \
        ("106", "89.15", "99.46")


@pytest.mark.parametrize("variant,kw", [
    ("Ti/16", {}),
    ("S/16", dict(image_size=96, pool="map", rep_size=128)),
    # The hybrid at the resolution it is used at (at 64 px the 2x2 maps of the last stage make XLA skip most
    # padded 3x3 taps); two Transformer blocks keep the compile short, the stem is what this case is about.
    ("R26+S/32", dict(pool="gap", depth=2)),
])
def test_matches_xla_cost_analysis_within_2_percent(variant, kw):
    _check_against_xla(vit_config(variant, num_classes=1000, **{"image_size": 224, **kw}))


def test_windowed_rel_pos_and_neck_match_xla_within_2_percent():
    # 12x12 grid in 5x5 windows (padded to 15x15) in block 0, global block 1, relative positions, SAM's neck.
    _check_against_xla(vit_config(width=128, depth=2, mlp_dim=256, num_heads=2, patch_size=8, image_size=96,
                                  window_size=5, global_blocks=(1,), rel_pos=True, dense=True, neck_dim=64))


def test_sam_b_windowed_flops_against_all_global():
    sam = dict(image_size=1024, rel_pos=True, dense=True, neck_dim=256)
    windowed = vit_flops(vit_config("B/16", window_size=14, global_blocks=(2, 5, 8, 11), **sam)).forward
    global_ = vit_flops(vit_config("B/16", **sam)).forward
    # SAM-B: about 488 GMACs, as commonly quoted for its image encoder; global attention costs 37% more.
    assert windowed == pytest.approx(972.1e9, rel=0.001) and global_ == pytest.approx(1335.2e9, rel=0.001)


def _check_against_xla(cfg):
    flops = xla_flops_per_image(FunctionalViT(cfg), cfg.image_size)
    assert flops == pytest.approx(vit_flops(cfg).forward, rel=0.02)  # the README says 2%
