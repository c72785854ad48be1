"""timm's VisionTransformerSAM layout (samvit_base_patch16): key mapping, architecture inference, export back."""

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vit_jax import cli
from vit_jax.checkpoints.layouts import CheckpointMismatchError
from vit_jax.checkpoints.loading import load_any
from vit_jax.checkpoints.timm_sam import infer_sam_config, to_timm_sam
from vit_jax.models import vit_config


def timm_sam_state_dict(width=32, depth=4, heads=2, mlp=64, patch=8, grid=5, window=3, global_blocks=(1, 3),
                        neck=16, seed=0, shapes_only=False):
    """A state dict with exactly the key names and shapes timm's VisionTransformerSAM(...).state_dict() has."""
    rng = np.random.default_rng(seed)

    def t(*shape):
        if shapes_only:  # zero-copy placeholders: architecture inference reads shapes only
            return np.broadcast_to(np.float32(0), shape)
        return rng.normal(size=shape).astype(np.float32)

    sd = {"patch_embed.proj.weight": t(width, 3, patch, patch), "patch_embed.proj.bias": t(width),
          "pos_embed": t(1, grid, grid, width)}
    for i in range(depth):
        s = grid if i in global_blocks else window
        b, hd = f"blocks.{i}", width // heads
        sd.update({f"{b}.norm1.weight": t(width), f"{b}.norm1.bias": t(width),
                   f"{b}.attn.rel_pos_h": t(2 * s - 1, hd), f"{b}.attn.rel_pos_w": t(2 * s - 1, hd),
                   f"{b}.attn.qkv.weight": t(3 * width, width), f"{b}.attn.qkv.bias": t(3 * width),
                   f"{b}.attn.proj.weight": t(width, width), f"{b}.attn.proj.bias": t(width),
                   f"{b}.norm2.weight": t(width), f"{b}.norm2.bias": t(width),
                   f"{b}.mlp.fc1.weight": t(mlp, width), f"{b}.mlp.fc1.bias": t(mlp),
                   f"{b}.mlp.fc2.weight": t(width, mlp), f"{b}.mlp.fc2.bias": t(width)})
    if neck:
        sd.update({"neck.0.weight": t(neck, width, 1, 1), "neck.1.weight": t(neck), "neck.1.bias": t(neck),
                   "neck.2.weight": t(neck, neck, 3, 3), "neck.3.weight": t(neck), "neck.3.bias": t(neck)})
    return sd


def test_sam_b_layout_infers_sams_architecture():
    # SAM ViT-B at 1024 px, shapes only (inference reads shapes): 14x14 windows, global blocks 2, 5, 8, 11.
    sd = timm_sam_state_dict(width=768, depth=12, heads=12, mlp=3072, patch=16, grid=64, window=14,
                             global_blocks=(2, 5, 8, 11), neck=256, shapes_only=True)
    cfg = infer_sam_config(sd)
    assert cfg == vit_config("B/16", image_size=1024, window_size=14, global_blocks=(2, 5, 8, 11), rel_pos=True,
                             dense=True, neck_dim=256, gelu="erf", ln_eps=1e-5)  # timm's nn.LayerNorm default


def test_timm_sam_state_dict_loads_and_exports_back_bit_identical(tmp_path):
    sd = timm_sam_state_dict()
    path = str(tmp_path / "sam.safetensors")
    save_file(sd, path)  # as timm writes it: no vit_jax metadata
    cfg, params = load_any(path)
    assert (cfg.grid, cfg.window_size, cfg.global_blocks, cfg.num_heads, cfg.neck_dim, cfg.gelu, cfg.ln_eps) == (
        (5, 5), 3, (1, 3), 2, 16, "erf", 1e-5)
    back = to_timm_sam(params, cfg)
    assert sorted(back) == sorted(sd)
    for k in sd:
        assert back[k].shape == sd[k].shape and np.array_equal(back[k], sd[k]), k
    # `vit-jax convert --to timm` writes the same tensors (and our metadata, which the next load prefers).
    assert cli.main(["convert", "--checkpoint", path, "--output", str(tmp_path / "again.safetensors"), "--to",
                     "timm"]) == 0
    again = load_file(str(tmp_path / "again.safetensors"))
    assert sorted(again) == sorted(sd) and all(np.array_equal(again[k], sd[k]) for k in sd)
    assert load_any(str(tmp_path / "again.safetensors"))[0] == cfg


def test_no_neck_and_a_classifier_head(tmp_path):
    cfg, _ = load_any(_save(tmp_path, timm_sam_state_dict(neck=0)))
    assert cfg.neck_dim == 0 and cfg.dense
    sd = timm_sam_state_dict()
    sd["head.fc.weight"], sd["head.fc.bias"] = np.zeros((10, 16), np.float32), np.zeros(10, np.float32)
    with pytest.raises(CheckpointMismatchError, match="num_classes=0"):
        load_any(_save(tmp_path, sd))


def test_rel_pos_tables_that_fit_no_window_are_a_clear_error(tmp_path):
    sd = timm_sam_state_dict()
    sd["blocks.2.attn.rel_pos_h"] = np.zeros((7, 16), np.float32)  # 4 rows: neither the 5x5 grid nor a 3x3 window
    with pytest.raises(CheckpointMismatchError, match="block 2's rel_pos tables"):
        load_any(_save(tmp_path, sd))


def _save(tmp_path, sd):
    path = str(tmp_path / f"sd{len(list(tmp_path.iterdir()))}.safetensors")
    save_file(sd, path)
    return path


def test_predict_writes_dense_and_token_maps_of_a_timm_sam_file(tmp_path, capsys):
    ckpt = _save(tmp_path, timm_sam_state_dict(seed=3))  # 40 px images: a 5x5 grid in 3x3 windows, neck of 16
    images = np.random.default_rng(0).uniform(-1, 1, (3, 40, 40, 3)).astype(np.float32)
    np.savez(tmp_path / "batch.npz", images=images)
    base = ["predict", "--checkpoint", ckpt, "--images", str(tmp_path / "batch.npz"), "--batch-size", "2"]
    assert cli.main([*base, "--features", "dense", "--output", str(tmp_path / "f.npy")]) == 0
    assert cli.main([*base, "--features", "tokens", "--output", str(tmp_path / "t.npy")]) == 0
    dense, tokens = np.load(tmp_path / "f.npy"), np.load(tmp_path / "t.npy")
    assert dense.shape == (3, 5, 5, 16) and tokens.shape == (3, 5, 5, 32)
    assert np.isfinite(dense).all() and np.isfinite(tokens).all() and not np.allclose(dense[0], dense[1])
    assert cli.main([*base, "--features", "logits", "--output", str(tmp_path / "x.npy")]) == 2
    assert "dense backbone" in capsys.readouterr().err


def test_convert_to_another_resolution_resizes_posemb_and_global_rel_pos_tables(tmp_path, capsys):
    src = _save(tmp_path, timm_sam_state_dict())  # 40 px: 5x5 grid, global tables of 9 rows, windowed of 5
    dst = str(tmp_path / "56.safetensors")
    assert cli.main(["convert", "--checkpoint", src, "--output", dst, "--to", "timm", "--image-size", "56"]) == 0
    assert "resized encoder/rel_pos_1/h 9 -> 13 rows" in capsys.readouterr().out
    cfg, _ = load_any(dst)
    out = load_file(dst)
    assert cfg.grid == (7, 7) and cfg.window_size == 3 and cfg.global_blocks == (1, 3)
    assert out["pos_embed"].shape == (1, 7, 7, 32) and out["blocks.1.attn.rel_pos_w"].shape == (13, 16)
    assert np.array_equal(out["blocks.0.attn.rel_pos_h"], timm_sam_state_dict()["blocks.0.attn.rel_pos_h"])
