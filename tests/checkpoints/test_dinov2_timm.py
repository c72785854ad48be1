"""DINOv2's ViT options (LayerScale, register tokens, SwiGLU, patch 14, DINOv2's position-embedding interpolation)
against timm: `vit_small_patch14_dinov2` and `vit_small_patch14_reg4_dinov2` (random weights, img_size=224) load
through `vit-jax predict` and give timm's pooled class token, and export back to timm's tensors exactly."""

import json

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from tests.interop import require_timm
from vit_jax import cli
from vit_jax.checkpoints.loading import load_any
from vit_jax.checkpoints.surgery import resize_posemb
from vit_jax.checkpoints.timm import save_timm
from vit_jax.checkpoints.training import model_meta
from vit_jax.models import vit_config
from vit_jax.models.config import ModelConfigError
from vit_jax.models.family import family_of
from vit_jax.models.vit import FunctionalViT

NAMES = ("vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2")


@pytest.fixture(scope="module")
def timm_models():
    """Both timm models, their LayerScale gammas and tokens drawn at a visible scale (timm initialises gamma at 1e-5,
    which would hide a wrong branch), with one image's pooled class token and forward_features."""
    timm = require_timm()
    import torch

    torch.manual_seed(0)
    image = np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
    out = {}
    for name in NAMES:
        model = timm.create_model(name, pretrained=False, img_size=224).eval()
        with torch.no_grad():
            for key, p in model.named_parameters():
                if key.endswith("gamma") or key in ("cls_token", "reg_token"):
                    p.normal_(0, 0.5)
            tokens = model.forward_features(torch.from_numpy(image.transpose(0, 3, 1, 2)))
            pooled = model.forward_head(tokens, pre_logits=True)
        out[name] = ({k: v.numpy() for k, v in model.state_dict().items()}, pooled.numpy(), tokens.numpy())
    return image, out


@pytest.mark.parametrize("name", NAMES)
def test_timm_dinov2_state_dict_gives_timms_features_through_predict(timm_models, tmp_path, name):
    image, models = timm_models
    sd, pooled, tokens = models[name]
    ckpt = str(tmp_path / f"{name}.safetensors")
    save_file(sd, ckpt)  # as timm writes it: no vit_jax metadata, the architecture comes from the tensors
    cfg, params = load_any(ckpt)
    registers = 4 if "reg4" in name else 0
    assert (cfg.patch_size, cfg.grid, cfg.layer_scale, cfg.registers, cfg.ffn, cfg.num_classes, cfg.gelu) == (
        (14, 14), (16, 16), 1e-5, registers, "mlp", 0, "erf")
    np.save(tmp_path / "image.npy", image)
    # --features logits of a headless model is its pooled class token: timm's forward_head(pre_logits=True).
    assert cli.main(["predict", "--checkpoint", ckpt, "--images", str(tmp_path / "image.npy"), "--features",
                     "logits", "--output", str(tmp_path / "f.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "f.npy"), pooled, atol=1e-4, rtol=0)
    # All of forward_features but the registers (dropped from our outputs): the class token and the patches.
    _, out = FunctionalViT(cfg).apply(params, image)
    np.testing.assert_allclose(np.asarray(out["encoded"]), np.delete(tokens, np.s_[1:1 + registers], 1), atol=1e-4)
    # Export back to timm's layout (no_embed_class for the register model): the same tensors, and our metadata.
    back = str(tmp_path / "back.safetensors")
    assert cli.main(["convert", "--checkpoint", ckpt, "--output", back, "--to", "timm"]) == 0
    again = load_file(back)
    assert sorted(again) == sorted(sd) and all(np.array_equal(again[k], sd[k]) for k in sd)
    with safe_open(back, "np") as f:
        kwargs = json.loads(f.metadata()["timm_kwargs"])
    assert kwargs["init_values"] == 1e-5 and kwargs.get("reg_tokens", 0) == registers
    assert load_any(back)[0] == cfg


def test_swiglu_layerscale_registers_export_to_a_timm_model_that_computes_the_same(tmp_path):
    """ViT-g's options at a tiny size: our random model, written with save_timm, loads strictly into timm's
    VisionTransformer built from the file's timm_kwargs (SwiGLUPacked named by class) and computes our features."""
    timm = require_timm()
    import torch

    cfg = vit_config(width=48, depth=2, num_heads=3, mlp_dim=64, patch_size=14, image_size=42, num_classes=0,
                     gelu="erf", layer_scale=0.5, registers=2, ffn="swiglu")
    params = FunctionalViT(cfg).init(__import__("jax").random.key(1))
    path = str(tmp_path / "g.safetensors")
    save_timm(path, params, cfg)
    with safe_open(path, "np") as f:
        kwargs = json.loads(f.metadata()["timm_kwargs"])
    kwargs["mlp_layer"] = getattr(timm.layers, kwargs["mlp_layer"])
    model = timm.models.VisionTransformer(**kwargs).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in load_file(path).items()}, strict=True)
    image = np.random.default_rng(1).uniform(-1, 1, (2, 42, 42, 3)).astype(np.float32)
    with torch.no_grad():
        theirs = model(torch.from_numpy(image.transpose(0, 3, 1, 2))).numpy()
    ours, _ = FunctionalViT(cfg).apply(params, image)
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)
    assert load_any(path)[0] == cfg  # the metadata records the options


def test_dinov2_posemb_resize_is_pytorchs_offset_bicubic_and_bicubic_is_timms():
    """DINOv2 resizes its 37x37 table (518 px) with F.interpolate(scale_factor=(new + 0.1) / old, bicubic, no
    antialias); timm's resample_abs_pos_embed (bicubic, antialiased) is our plain 'bicubic' when enlarging (when
    shrinking its antialiasing differs)."""
    require_timm()
    import torch
    import torch.nn.functional as F
    from timm.layers import resample_abs_pos_embed

    table = np.random.default_rng(2).normal(size=(1, 1 + 37 * 37, 8)).astype(np.float32)
    grid = torch.from_numpy(table[:, 1:]).reshape(1, 37, 37, 8).permute(0, 3, 1, 2)
    for new in (16, 7):
        theirs = F.interpolate(grid, scale_factor=((new + 0.1) / 37,) * 2, mode="bicubic", antialias=False)
        ours = resize_posemb(table, (37, 37), (new, new), 1, "dinov2")
        np.testing.assert_array_equal(ours[:, :1], table[:, :1])
        np.testing.assert_allclose(ours[0, 1:], theirs[0].permute(1, 2, 0).reshape(-1, 8).numpy(), atol=5e-5)
    small = table[:, :1 + 7 * 7]
    timm_resized = resample_abs_pos_embed(torch.from_numpy(small), (16, 16), num_prefix_tokens=1).numpy()
    np.testing.assert_allclose(resize_posemb(small, (7, 7), (16, 16), 1, "bicubic"), timm_resized, atol=5e-5)


def test_options_are_validated_and_recorded_in_run_metadata():
    cfg = vit_config("S/14", num_classes=0, layer_scale=1e-5, registers=4, ffn="swiglu", posemb_resize="dinov2")
    meta = model_meta(cfg)
    assert family_of(cfg).from_meta(meta) == cfg  # a saved run reloads with its DINOv2 options
    for bad, match in ((dict(layer_scale=-1.0), "layer_scale"), (dict(registers=-1), "registers"),
                       (dict(ffn="geglu"), "ffn"), (dict(registers=4, pool="gap"), "pool='token'"),
                       (dict(posemb_resize="nearest"), "posemb_resize")):
        with pytest.raises(ModelConfigError, match=match):
            vit_config("S/14", **bad)
