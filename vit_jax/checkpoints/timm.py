"""Export to (and import from) a timm `VisionTransformer` state dict stored as safetensors, with numpy only.

timm key names and tensor layouts (PyTorch: Linear weight (out, in), Conv2d weight (out, in, kh, kw)):
`cls_token`, `pos_embed` (class row included when the model has a class token), `patch_embed.proj.*`,
DeiT's `dist_token` and `head_dist.*` (timm's VisionTransformerDistilled: `pos_embed` then has both token rows),
`blocks.{i}.norm1/attn.qkv/attn.proj/norm2/mlp.fc1/mlp.fc2.*`, `norm.*`, `head.*`, and for attention pooling
`attn_pool.{latent,q,kv,proj,norm,mlp.fc1,mlp.fc2}`. DINOv2's options (timm's `vit_*_patch14_dinov2` and
`vit_*_patch14_reg4_dinov2`): LayerScale `blocks.{i}.ls{1,2}.gamma`, SwiGLU (timm_blocks.py), and register tokens
`reg_token` (1, R, D); timm builds its register models with `no_embed_class=True`: `pos_embed` has no class row and
the class token none. Our class token always has a row, so such a file loads with a zero class row, and a model
with registers is written in that layout, its class row folded into `cls_token` (as timm's conversion of the
original DINOv2 checkpoints does), which computes the same function.

The matching timm constructor arguments are written to the file's metadata (`timm_kwargs`), so that
`VisionTransformer(**timm_kwargs)` computes the same function: for global-average pooling they include `fc_norm=False`
so that timm applies the final LayerNorm before pooling, as the ViT paper does, and for our default tanh-approximate
GELU `act_layer='gelu_tanh'` (timm's default is the exact erf GELU). timm's VisionTransformer has no pre-logits
(representation) layer, so such models must drop it first, and it cannot hold a ResNet stem: plain ViTs only.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from vit_jax.checkpoints.layouts import CheckpointMismatchError, check_against, flatten, unflatten
from vit_jax.checkpoints.timm_blocks import (blocks_from_timm, blocks_to_timm, conv_from_torch, conv_to_torch,
                                             linear_to_torch)
from vit_jax.models.config import ViTConfig


def check_timm_compatible(cfg: ViTConfig) -> None:
    """Raises ValueError (one line, with the fix) for a model that timm's VisionTransformer cannot express."""
    # A hybrid needs timm's HybridEmbed around a ResNetV2 backbone, which no VisionTransformer(**kwargs) builds;
    # rather than a file that loads into nothing, say so.
    if cfg.resnet_layers:
        raise ValueError(f"timm export supports plain ViTs only: {cfg.name} has a ResNet stem; convert it with "
                         "--to official instead, which timm reads with its own npz loader (as it loads the released "
                         "R50+ViT files)")
    if cfg.rep_size:
        raise ValueError("timm's VisionTransformer has no pre-logits layer: convert with --drop-pre-logits "
                         "(the head is then re-initialised) or keep the official npz layout")
    if cfg.posemb != "learn":
        raise ValueError("timm export needs a learned position embedding (timm has no fixed sin-cos ViT posemb)")


def timm_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    kw: dict[str, Any] = dict(img_size=list(cfg.image_size), patch_size=list(cfg.patch_size), embed_dim=cfg.width,
                              depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.width,
                              num_classes=cfg.num_classes, qkv_bias=True)
    if cfg.ffn == "swiglu":  # timm's SwiGLUPacked: fc1 holds both halves. mlp_layer names a timm.layers class
        kw.update(mlp_ratio=2 * cfg.mlp_dim / cfg.width, mlp_layer="SwiGLUPacked", act_layer="silu")
    elif cfg.gelu == "tanh":  # timm resolves the name with get_act_layer; erf models keep timm's default nn.GELU
        kw["act_layer"] = "gelu_tanh"
    if cfg.layer_scale:
        kw["init_values"] = cfg.layer_scale
    if cfg.registers:
        kw.update(reg_tokens=cfg.registers, no_embed_class=True)
    if cfg.pool == "token":
        kw.update(global_pool="token", class_token=True)
    elif cfg.pool == "gap":
        kw.update(global_pool="avg", class_token=False, fc_norm=False)
    else:
        kw.update(global_pool="map", class_token=False)
    return kw


def to_timm(params: dict[str, Any], cfg: ViTConfig) -> dict[str, np.ndarray]:
    """Our parameters -> timm state dict (numpy arrays)."""
    check_timm_compatible(cfg)
    p = {k: np.asarray(v) for k, v in flatten(params).items()}
    out: dict[str, np.ndarray] = {}
    out["patch_embed.proj.weight"] = conv_to_torch(p["embedding/kernel"])
    out["patch_embed.proj.bias"] = p["embedding/bias"]
    if cfg.pool == "token":
        out["cls_token"] = p["cls"]
    if cfg.distilled:
        out["dist_token"] = p["dist"]
    out["pos_embed"] = p["pos_embedding"]
    if cfg.registers:  # timm's no_embed_class layout (see the module docstring)
        out["reg_token"] = p["reg"]
        out["cls_token"] = p["cls"] + p["pos_embedding"][:, :1]
        out["pos_embed"] = p["pos_embedding"][:, 1:]
    d = cfg.width
    out.update(blocks_to_timm(p, cfg))
    out["norm.weight"], out["norm.bias"] = p["encoder/norm/scale"], p["encoder/norm/bias"]
    if cfg.pool == "map":
        m = "map_head"
        out["attn_pool.latent"] = p[f"{m}/probe"]
        out["attn_pool.q.weight"] = p[f"{m}/attn/query/kernel"].reshape(d, d).T.copy()
        out["attn_pool.q.bias"] = p[f"{m}/attn/query/bias"].reshape(d)
        out["attn_pool.kv.weight"] = np.concatenate([p[f"{m}/attn/{n}/kernel"].reshape(d, d).T
                                                     for n in ("key", "value")])
        out["attn_pool.kv.bias"] = np.concatenate([p[f"{m}/attn/{n}/bias"].reshape(d) for n in ("key", "value")])
        out["attn_pool.proj.weight"] = p[f"{m}/attn/out/kernel"].reshape(d, d).T.copy()
        out["attn_pool.proj.bias"] = p[f"{m}/attn/out/bias"]
        out["attn_pool.norm.weight"], out["attn_pool.norm.bias"] = p[f"{m}/ln/scale"], p[f"{m}/ln/bias"]
        for fc in ("fc1", "fc2"):
            out[f"attn_pool.mlp.{fc}.weight"] = linear_to_torch(p[f"{m}/mlp/{fc}/kernel"])
            out[f"attn_pool.mlp.{fc}.bias"] = p[f"{m}/mlp/{fc}/bias"]
    if cfg.num_classes:
        out["head.weight"] = linear_to_torch(p["head/kernel"])
        out["head.bias"] = p["head/bias"]
    if cfg.distilled:
        out["head_dist.weight"] = linear_to_torch(p["head_dist/kernel"])
        out["head_dist.bias"] = p["head_dist/bias"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def from_timm(sd: dict[str, np.ndarray], cfg: ViTConfig) -> dict[str, Any]:
    """timm state dict -> our parameters (exact inverse of `to_timm`)."""
    check_timm_compatible(cfg)
    sd = dict(sd)
    d, h = cfg.width, cfg.num_heads
    k = d // h
    p: dict[str, np.ndarray] = {}

    def pop(key):
        if key not in sd:
            raise CheckpointMismatchError(f"timm state dict lacks '{key}' needed by {cfg.name}")
        return np.asarray(sd.pop(key))

    p["embedding/kernel"] = conv_from_torch(pop("patch_embed.proj.weight"))
    p["embedding/bias"] = pop("patch_embed.proj.bias")
    if cfg.pool == "token":
        p["cls"] = pop("cls_token")
    if cfg.distilled:
        p["dist"] = pop("dist_token")
    if cfg.registers:
        p["reg"] = pop("reg_token")
    p["pos_embedding"] = pop("pos_embed")
    if cfg.pool == "token" and p["pos_embedding"].shape[1] == cfg.num_patches:  # timm's no_embed_class layout
        row = np.zeros_like(p["pos_embedding"][:, :cfg.num_prefix_tokens])
        p["pos_embedding"] = np.concatenate([row, p["pos_embedding"]], 1)
    p.update(blocks_from_timm(pop, cfg))
    p["encoder/norm/scale"], p["encoder/norm/bias"] = pop("norm.weight"), pop("norm.bias")
    if cfg.pool == "map":
        m = "map_head"
        p[f"{m}/probe"] = pop("attn_pool.latent")
        p[f"{m}/attn/query/kernel"] = pop("attn_pool.q.weight").T.reshape(d, h, k)
        p[f"{m}/attn/query/bias"] = pop("attn_pool.q.bias").reshape(h, k)
        kv_w, kv_b = pop("attn_pool.kv.weight"), pop("attn_pool.kv.bias")
        for j, n in enumerate(("key", "value")):
            p[f"{m}/attn/{n}/kernel"] = kv_w[j * d:(j + 1) * d].T.reshape(d, h, k)
            p[f"{m}/attn/{n}/bias"] = kv_b[j * d:(j + 1) * d].reshape(h, k)
        p[f"{m}/attn/out/kernel"] = pop("attn_pool.proj.weight").T.reshape(h, k, d)
        p[f"{m}/attn/out/bias"] = pop("attn_pool.proj.bias")
        p[f"{m}/ln/scale"], p[f"{m}/ln/bias"] = pop("attn_pool.norm.weight"), pop("attn_pool.norm.bias")
        for fc in ("fc1", "fc2"):
            p[f"{m}/mlp/{fc}/kernel"] = pop(f"attn_pool.mlp.{fc}.weight").T
            p[f"{m}/mlp/{fc}/bias"] = pop(f"attn_pool.mlp.{fc}.bias")
    if cfg.num_classes:
        p["head/kernel"] = pop("head.weight").T
        p["head/bias"] = pop("head.bias")
    if cfg.distilled:
        p["head_dist/kernel"] = pop("head_dist.weight").T
        p["head_dist/bias"] = pop("head_dist.bias")
    if sd:
        raise CheckpointMismatchError(f"timm state dict has keys {cfg.name} does not use: {sorted(sd)}")
    p = {key: np.ascontiguousarray(v) for key, v in p.items()}
    from vit_jax.checkpoints.npz import expected_flat_shapes

    check_against(p, expected_flat_shapes(cfg), f"timm state dict vs {cfg.name}")
    return unflatten(p)


def save_timm(path: str, params: dict[str, Any], cfg: ViTConfig) -> None:
    from safetensors.numpy import save_file

    if cfg.dense or cfg.spatial_attention:  # a SAM-style backbone: timm's VisionTransformerSAM layout
        from vit_jax.checkpoints.timm_sam import save_timm_sam

        return save_timm_sam(path, params, cfg)

    meta = {"format": "pt", "timm_kwargs": json.dumps(timm_kwargs(cfg)), "vit_jax_config": json.dumps(
        {"variant_name": cfg.name, **{f: getattr(cfg, f) for f in ("image_size", "patch_size", "width", "depth",
                                                                  "mlp_dim", "num_heads", "pool", "num_classes",
                                                                  "gelu", "distilled", "layer_scale", "registers",
                                                                  "ffn")}})}
    if cfg.distilled:  # the class those arguments build: timm.models.deit's, which takes the same arguments
        meta["timm_class"] = "VisionTransformerDistilled"
    save_file(to_timm(params, cfg), path, metadata=meta)


def load_timm(path: str, cfg: ViTConfig | None = None) -> tuple[ViTConfig, dict[str, Any]]:
    """Reads a timm ViT safetensors file. Without `cfg` the architecture comes from our metadata or the tensors."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    sd = load_file(path)
    with safe_open(path, "np") as f:
        meta = f.metadata() or {}
    from vit_jax.checkpoints import timm_sam

    if timm_sam.is_sam_state_dict(sd):  # routed by the keys: rel_pos tables, a neck, or an NHWC pos_embed
        return timm_sam.load_timm_sam(sd, meta, cfg)
    if cfg is None:
        cfg = infer_timm_config(sd, json.loads(meta["vit_jax_config"]) if "vit_jax_config" in meta else None)
    return cfg, from_timm(sd, cfg)


def infer_timm_config(sd: dict[str, np.ndarray], meta: dict[str, Any] | None = None) -> ViTConfig:
    from vit_jax.models.config import vit_config

    if meta:
        meta = {k: v for k, v in meta.items() if k != "variant_name"}
        return vit_config(**meta)
    width, _, ph, pw = sd["patch_embed.proj.weight"].shape
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    # SwiGLUPacked's fc1 holds gate and value rows: twice fc2's input width (a GELU MLP's are equal).
    fc1_rows, mlp = sd["blocks.0.mlp.fc1.weight"].shape[0], sd["blocks.0.mlp.fc2.weight"].shape[1]
    ffn = "swiglu" if fc1_rows == 2 * mlp else "mlp"
    pool = "token" if "cls_token" in sd else ("map" if "attn_pool.latent" in sd else "gap")
    distilled = "dist_token" in sd  # timm's VisionTransformerDistilled (deit_*_distilled_*)
    registers = sd["reg_token"].shape[1] if "reg_token" in sd else 0
    rows = sd["pos_embed"].shape[1]
    prefix = (1 if pool == "token" else 0) + int(distilled)
    # timm's no_embed_class models (DINOv2 with registers, DeiT III) have no prefix rows; a table cannot be both a
    # square and a square plus prefix rows (but for the empty grid), so the shape says which.
    n = rows - prefix if _is_square(rows - prefix) else rows
    g = int(round(n**0.5))
    if g * g != n:
        raise CheckpointMismatchError("cannot infer a square image size from timm pos_embed; pass a config")
    # Head count is not recorded in a timm state dict (qkv is fused): take it from the named ViT size of this
    # width, else assume the usual head dimension of 64.
    from vit_jax.models.config import SIZES

    heads = next((s["num_heads"] for s in SIZES.values() if s["width"] == width), max(width // 64, 1))
    # LayerScale's initial gamma is not in the file (only the trained one): DINOv2's 1e-5 is recorded, which only
    # matters to a run that trains from this config's fresh initialisation.
    layer_scale = 1e-5 if "blocks.0.ls1.gamma" in sd else 0.0
    # Without our metadata the file is timm's own: its VisionTransformer defaults to the exact (erf) GELU.
    return vit_config(width=width, depth=depth, mlp_dim=mlp, num_heads=heads, patch_size=(ph, pw), pool=pool,
                      image_size=(g * ph, g * pw), num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 0,
                      gelu="erf", distilled=distilled, layer_scale=layer_scale, registers=registers, ffn=ffn)


def _is_square(n: int) -> bool:
    return n > 0 and int(round(n**0.5)) ** 2 == n
