"""The Swin family (models/swin.py) against timm's SwinTransformer, built with random weights (nothing downloaded) and
read by our timm loader (checkpoints/swin_formats.py).

Two cases: a small Swin whose stages exercise what 224 px with window 7 does not (a grid padded to whole windows under
the shifted-window mask, and a last stage smaller than the window, which shrinks and stops shifting), compared with
timm's forward in float64; and the named `swin_tiny_patch4_window7_224` written as a .safetensors state dict and run
through `vit-jax predict`, whose logits must be timm's within 1e-4.
"""

import numpy as np
import pytest

from tests.interop import require_timm

TOLERANCE = 2e-5  # |ours - timm in float64| over the largest logit; seen ~5e-7


def randomise(model, scale: float) -> None:
    """Every parameter moved off its init (timm's LayerNorms start at 1/0, which would hide a swapped scale/bias)."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)


def test_padded_shifted_and_clamped_windows_match_timm_in_float64():
    require_timm()
    import jax
    import torch
    from timm.models.swin_transformer import SwinTransformer

    from vit_jax.checkpoints.swin_formats import from_swin_timm
    from vit_jax.models.build import build_model

    # 96 px, patch 4, window 5: stage grids 24 (padded to 25), 12 (to 15), 6 (to 10) and 3 (window clamped to 3).
    model = SwinTransformer(img_size=96, window_size=5, embed_dim=16, depths=(2, 1, 1, 2), num_heads=(1, 1, 2, 4),
                            num_classes=5).eval()
    randomise(model, 0.2)
    assert [b.shift_size for b in model.layers[0].blocks] == [(0, 0), (2, 2)]
    assert model.layers[3].blocks[1].window_size == (3, 3) and model.layers[3].blocks[1].shift_size == (0, 0)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 96, 96, 3)).astype(np.float32)
    with torch.no_grad():
        timm64 = model.double()(torch.from_numpy(images).permute(0, 3, 1, 2).double()).numpy()
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    cfg, params = from_swin_timm(state, fallback_image_size=96)
    assert (cfg.embed_dim, cfg.depths, cfg.num_heads, cfg.window_size) == (16, (2, 1, 1, 2), (1, 1, 2, 4), 5)
    ours = np.asarray(jax.jit(build_model(cfg).apply)(params, images)[0])
    scale = max(1.0, float(np.abs(timm64).max()))
    assert np.ptp(timm64, axis=1).min() > 0.5  # logits that tell classes apart
    assert float(np.abs(ours - timm64).max()) / scale <= TOLERANCE


def test_named_swin_tiny_state_dict_gives_timms_logits_through_predict(tmp_path, capsys):
    timm = require_timm()
    import torch
    from safetensors.torch import save_file

    from vit_jax import cli

    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    randomise(model, 0.05)
    images = np.random.default_rng(1).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
    with torch.no_grad():
        theirs = model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
    # As timm writes a state dict: its persistent tensors (the index and mask buffers are not).
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "swin_t.safetensors"))
    np.save(tmp_path / "images.npy", images)
    assert cli.main(["predict", "--checkpoint", str(tmp_path / "swin_t.safetensors"), "--images",
                     str(tmp_path / "images.npy"), "--output", str(tmp_path / "logits.npy")]) == 0
    assert "Swin-T (embed 96, depths 2-2-6-2, heads 3-6-12-24, window 7" in capsys.readouterr().out
    ours = np.load(tmp_path / "logits.npy")
    assert ours.shape == (1, 1000) and np.ptp(theirs) > 1.0
    assert np.abs(ours - theirs).max() <= 1e-4
