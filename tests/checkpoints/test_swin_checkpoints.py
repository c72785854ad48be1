"""Swin checkpoints without an oracle: our parameters -> timm's state dict (.safetensors) -> load_any gives them back;
the original repository's key layout reads the same; `vit-jax convert` writes a new head; fine-tuning surgery resizes
the bias tables to another window; a state dict that does not fit is one error naming what is missing."""

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vit_jax import cli
from vit_jax.checkpoints.layouts import CheckpointMismatchError, flatten
from vit_jax.checkpoints.loading import load_any
from vit_jax.checkpoints.surgery import adapt_params
from vit_jax.checkpoints.swin_formats import from_swin_timm, save_swin_timm, to_swin_timm
from vit_jax.models.build import build_model
from vit_jax.models.swin import resize_rel_bias_table
from vit_jax.models.swin_config import swin_config

CFG = swin_config("Swin-32-2-1", num_classes=5, image_size=64, window_size=4)


def random_params(cfg, seed: int = 0):
    """Random in every array, from the model's shapes (no init traced: eager init costs seconds per op kind)."""
    import jax

    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda a: rng.normal(0, 0.2, a.shape).astype(np.float32), build_model(cfg).shapes)


@pytest.fixture(scope="module")
def params():
    return random_params(CFG)  # the init's zero head and unit LayerNorm scales would hide swapped arrays


def assert_same(a, b):
    fa, fb = flatten(a), flatten(b)
    assert sorted(fa) == sorted(fb) and all(np.array_equal(fa[k], fb[k]) for k in fa)


def test_timm_layout_round_trip_with_and_without_our_metadata(params, tmp_path):
    path = str(tmp_path / "swin.safetensors")
    save_swin_timm(path, params, CFG)
    cfg, loaded = load_any(path)
    assert cfg == CFG
    assert_same(loaded, params)
    sd = load_file(path)
    assert sd["layers.0.blocks.0.attn.qkv.weight"].shape == (96, 32)  # timm's (3 * dim, dim)
    assert sd["layers.1.downsample.reduction.weight"].shape == (64, 128)
    save_file(sd, str(tmp_path / "bare.safetensors"))  # as timm writes it: no metadata of ours
    cfg, loaded = load_any(str(tmp_path / "bare.safetensors"))
    # timm's files do not record the resolution: the named models' last stage is exactly one window, so a bare file
    # reads at window * patch * 2**(stages - 1) = 32 px.
    assert cfg.image_size == (32, 32) and cfg.replace(image_size=64) == CFG
    assert_same(loaded, params)


def test_original_repository_layout_reads_the_same(params):
    timm = to_swin_timm(params, CFG)
    original = {}
    for key, value in timm.items():  # downsample at the end of the stage before; the head is `head`
        key = key.replace("layers.1.downsample", "layers.0.downsample").replace("head.fc.", "head.")
        original[key] = value
    original["layers.0.blocks.1.attn_mask"] = np.zeros((4, 16, 16), np.float32)  # buffers are skipped
    original["layers.0.blocks.0.attn.relative_position_index"] = np.zeros((16, 16), np.int64)
    cfg, loaded = from_swin_timm(original, fallback_image_size=64)
    assert cfg == CFG
    assert_same(loaded, params)


def test_a_state_dict_that_does_not_fit_names_the_key(params):
    timm = to_swin_timm(params, CFG)
    del timm["layers.1.blocks.0.mlp.fc2.bias"]
    with pytest.raises(CheckpointMismatchError, match=r"missing layers.1.blocks.0.mlp.fc2.bias"):
        from_swin_timm(timm, fallback_image_size=64)
    timm = to_swin_timm(params, CFG)
    timm["layers.0.blocks.0.attn.extra"] = np.zeros(3, np.float32)
    with pytest.raises(CheckpointMismatchError, match=r"unexpected \['layers.0.blocks.0.attn.extra'\]"):
        from_swin_timm(timm, fallback_image_size=64)


def test_convert_writes_a_new_zero_head(params, tmp_path, capsys):
    src, dst = str(tmp_path / "src.safetensors"), str(tmp_path / "dst.safetensors")
    save_swin_timm(src, params, CFG)
    assert cli.main(["convert", "--checkpoint", src, "--output", dst, "--to", "timm", "--num-classes", "3"]) == 0
    cfg, loaded = load_any(dst)
    assert cfg == CFG.replace(num_classes=3) and not loaded["head"]["kernel"].any()
    assert np.array_equal(loaded["stage1"]["block0"]["attn"]["rel_bias"], params["stage1"]["block0"]["attn"]["rel_bias"])
    assert cli.main(["convert", "--checkpoint", src, "--output", dst, "--to", "official"]) != 0
    assert "exports to timm's layout only" in capsys.readouterr().err


def test_fine_tune_surgery_resizes_bias_tables_to_a_new_window(params):
    target = CFG.replace(window_size=6, image_size=96, num_classes=7)  # grids 24 and 12: windows of 6 in both
    init = random_params(target, seed=1)
    adapted, notes = adapt_params(params, CFG, init, target)
    table = adapted["stage0"]["block1"]["attn"]["rel_bias"]
    assert table.shape == (121, 1)
    assert np.allclose(table, resize_rel_bias_table(params["stage0"]["block1"]["attn"]["rel_bias"], (6, 6)))
    # Bicubic through the 7x7 table's points: the old centre offset (0, 0) lands on the new centre exactly.
    old = params["stage0"]["block1"]["attn"]["rel_bias"].reshape(7, 7)
    assert table.reshape(11, 11)[5, 5] == pytest.approx(float(old[3, 3]), abs=1e-5)
    assert adapted["head"]["kernel"] is init["head"]["kernel"]  # the target's own fresh head
    assert sum("resized stage" in n for n in notes) == 3 and any("re-initialised head" in n for n in notes)
    assert_same({k: v for k, v in adapted.items() if k == "patch_embed"}, {"patch_embed": params["patch_embed"]})
