"""DeiT's distillation token (ViTConfig.distilled) against timm's own: `deit_tiny_distilled_patch16_224` built with
random weights (nothing downloaded), its state dict saved by safetensors exactly as timm holds it (no vit_jax
metadata), then run through `vit-jax predict`. The file's architecture is inferred from the tensors (the
`dist_token` and `head_dist` say distilled; timm's exact GELU), and the prediction is the average of the class and
distillation heads, as timm's inference forward.

Every parameter is perturbed away from timm's initialisation (zero biases, unit norms, and heads that would hide a
swapped head or token), and our fp32 logits are compared with timm's forward in float64."""

import json

import numpy as np

from tests.interop import require_timm
from vit_jax import cli
from vit_jax.checkpoints.loading import load_any
from vit_jax.checkpoints.timm import save_timm

TOLERANCE = 1e-4  # |ours - timm in float64| over the largest logit (at least 1)


def test_deit_tiny_distilled_logits_through_predict_match_timm(tmp_path, capsys):
    require_timm()
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            unit = 1.0 if name.endswith(".weight") and p.ndim == 1 else 0.0  # LayerNorm scales near 1
            p.copy_(torch.randn_like(p) * (0.05 if p.ndim > 1 else 0.02) + unit)
    path = tmp_path / "deit.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    images = np.random.default_rng(1).uniform(-1, 1, (2, 224, 224, 3)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    with torch.no_grad():
        timm64 = model.double()(torch.from_numpy(images).permute(0, 3, 1, 2).double()).numpy()

    out = tmp_path / "logits.npy"
    assert cli.main(["predict", "--checkpoint", str(path), "--images", str(tmp_path / "images.npy"),
                     "--output", str(out)]) == 0
    assert "distilled" in capsys.readouterr().out  # the description names the distillation token
    ours = np.load(out)
    assert ours.shape == (2, 1000)
    scale = max(1.0, float(np.abs(timm64).max()))
    assert np.ptp(timm64, axis=1).min() > 0.5  # logits that tell classes apart
    assert float(np.abs(ours - timm64).max()) / scale <= TOLERANCE

    # Our own export of the same parameters is that state dict again, and names timm's class.
    cfg, params = load_any(str(path))
    assert cfg.distilled and cfg.num_prefix_tokens == 2 and cfg.seq_len == 198
    save_timm(str(tmp_path / "ours.safetensors"), params, cfg)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "ours.safetensors"), "np") as f:
        assert f.metadata()["timm_class"] == "VisionTransformerDistilled"
        assert json.loads(f.metadata()["vit_jax_config"])["distilled"] is True
        exported = {k: f.get_tensor(k) for k in f.keys()}
    original = {k: v.float().numpy() for k, v in model.state_dict().items()}
    assert exported.keys() == original.keys()
    for k in original:
        np.testing.assert_array_equal(exported[k], original[k], err_msg=k)
