"""The Swin family's checkpoint formats on the registry (checkpoints/formats.py): timm `swin_*` state dicts in
.safetensors (timm's layout, or the paper's original one) to read, and `vit-jax convert --to timm` to write.

timm's layout: `patch_embed.proj` (conv) and `patch_embed.norm`, `layers.{s}.downsample.{norm,reduction}` at the start
of stage s >= 1, `layers.{s}.blocks.{b}.{norm1, attn.qkv, attn.relative_position_bias_table, attn.proj, norm2,
mlp.fc1, mlp.fc2}`, `norm`, `head.fc`. The original repository's files keep each downsample at the end of the stage
before and name the head `head`; both are read (timm's `checkpoint_filter_fn` documents the same remapping).
`relative_position_index` and `attn_mask` are buffers computed from the sizes, and are skipped.

The architecture is read off the arrays: embed dim and patch from the patch embedding, depths from the block keys,
heads and window size from the bias tables (the largest table's window: a stage no larger than the window has a
smaller one). timm's files do not record the resolution; the timm names put the last stage at exactly one window
(224 px = 7 x 32 for window 7, 384 = 12 x 32), which is the default; ours record it in the file's metadata.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping

import numpy as np

from vit_jax.checkpoints import formats
from vit_jax.checkpoints.layouts import CheckpointMismatchError, CheckpointReadError, check_against, flatten, unflatten
from vit_jax.models.swin_config import SwinConfig

TABLE = "relative_position_bias_table"
_BUFFERS = ("relative_position_index", "attn_mask")


def _normalise_keys(sd: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """timm's key names from timm's or the original repository's state dict; buffers dropped."""
    original = "head.weight" in sd
    out = {}
    for key, value in sd.items():
        if key.endswith(_BUFFERS):
            continue
        if original:
            key = re.sub(r"^layers\.(\d+)\.downsample", lambda m: f"layers.{int(m[1]) + 1}.downsample", key)
            key = re.sub(r"^head\.", "head.fc.", key)
        out[key] = np.asarray(value)
    return out


def infer_config(sd: Mapping[str, np.ndarray], recorded: Mapping[str, Any] | None = None,
                 fallback_image_size: Any = None) -> SwinConfig:
    """The SwinConfig of a timm-layout state dict (see the module docstring for what is read from where)."""
    if "patch_embed.proj.weight" not in sd:
        raise CheckpointReadError("not a Swin state dict: no patch_embed.proj.weight")
    embed_dim, _, ph, pw = sd["patch_embed.proj.weight"].shape
    depths, heads, windows = [], [], []
    for s in range(len({int(m[1]) for k in sd if (m := re.match(r"layers\.(\d+)\.blocks\.", k))})):
        blocks = {int(m[1]) for k in sd if (m := re.match(rf"layers\.{s}\.blocks\.(\d+)\.", k))}
        if not blocks:
            raise CheckpointMismatchError(f"Swin state dict: stage {s} has no blocks")
        depths.append(len(blocks))
        rows, h = sd[f"layers.{s}.blocks.0.attn.{TABLE}"].shape
        heads.append(h)
        windows.append((math.isqrt(rows) + 1) // 2)
    if not depths:
        raise CheckpointMismatchError("Swin state dict: no layers.{s}.blocks.{b} keys")
    mlp_ratio = sd["layers.0.blocks.0.mlp.fc1.weight"].shape[0] / embed_dim
    head = sd.get("head.fc.weight")
    recorded = dict(recorded or {})
    window = int(recorded.pop("window_size", max(windows)))
    last = window * 2 ** (len(depths) - 1)
    image_size = recorded.pop("image_size", None) or fallback_image_size or (last * ph, last * pw)
    return SwinConfig(embed_dim=int(embed_dim), depths=tuple(depths), num_heads=tuple(heads), window_size=window,
                      patch_size=(int(ph), int(pw)), mlp_ratio=float(mlp_ratio),
                      num_classes=0 if head is None else int(head.shape[0]),
                      image_size=_pair(image_size), **recorded)


def _pair(size: Any) -> tuple[int, int]:
    return (int(size), int(size)) if np.isscalar(size) else (int(size[0]), int(size[1]))


def _pairs(cfg: SwinConfig) -> list[tuple[str, str]]:
    """(our flat key prefix, timm's key prefix) of every layer."""
    pairs = [("patch_norm", "patch_embed.norm")]
    for s, depth in enumerate(cfg.depths):
        if s:
            pairs.append((f"stage{s}/downsample/norm", f"layers.{s}.downsample.norm"))
        for b in range(depth):
            ours, theirs = f"stage{s}/block{b}", f"layers.{s}.blocks.{b}"
            pairs += [(f"{ours}/{n}", f"{theirs}.{n.replace('/', '.')}") for n in ("norm1", "norm2", "mlp/fc1", "mlp/fc2")]
    pairs.append(("norm", "norm"))
    if cfg.num_classes:
        pairs.append(("head", "head.fc"))
    return pairs


def from_swin_timm(sd: Mapping[str, Any], recorded: Mapping[str, Any] | None = None, *,
                   fallback_image_size: Any = None) -> tuple[SwinConfig, dict[str, Any]]:
    """(config, our parameters) of a timm (or original-layout) Swin state dict of numpy arrays."""
    from vit_jax.models.build import build_model

    sd = _normalise_keys(sd)
    cfg = infer_config(sd, recorded, fallback_image_size)
    used: set[str] = set()

    def take(key: str) -> np.ndarray:
        if key not in sd:
            raise CheckpointMismatchError(f"timm state dict vs {cfg.name}: missing {key}")
        used.add(key)
        return sd[key]

    ours: dict[str, np.ndarray] = {"patch_embed/kernel": take("patch_embed.proj.weight").transpose(2, 3, 1, 0),
                                   "patch_embed/bias": take("patch_embed.proj.bias")}
    for mine, theirs in _pairs(cfg):
        if mine.endswith(("norm", "norm1", "norm2")):
            ours[f"{mine}/scale"], ours[f"{mine}/bias"] = take(f"{theirs}.weight"), take(f"{theirs}.bias")
        else:
            ours[f"{mine}/kernel"], ours[f"{mine}/bias"] = take(f"{theirs}.weight").T, take(f"{theirs}.bias")
    for s, depth in enumerate(cfg.depths):
        dim, heads = cfg.stage_dim(s), cfg.num_heads[s]
        if s:
            ours[f"stage{s}/downsample/reduction"] = take(f"layers.{s}.downsample.reduction.weight").T
        for b in range(depth):
            mine, theirs = f"stage{s}/block{b}/attn", f"layers.{s}.blocks.{b}.attn"
            qkv = take(f"{theirs}.qkv.weight").T.reshape(dim, 3, heads, dim // heads)
            qkv_bias = take(f"{theirs}.qkv.bias").reshape(3, heads, dim // heads)
            for i, name in enumerate(("query", "key", "value")):
                ours[f"{mine}/{name}/kernel"], ours[f"{mine}/{name}/bias"] = qkv[:, i], qkv_bias[i]
            ours[f"{mine}/out/kernel"] = take(f"{theirs}.proj.weight").T.reshape(heads, dim // heads, dim)
            ours[f"{mine}/out/bias"] = take(f"{theirs}.proj.bias")
            ours[f"{mine}/rel_bias"] = take(f"{theirs}.{TABLE}")
    unexpected = sorted(set(sd) - used)
    if unexpected:
        raise CheckpointMismatchError(f"timm state dict vs {cfg.name}: unexpected {unexpected[:8]}")
    ours = {k: np.ascontiguousarray(v) for k, v in ours.items()}
    check_against(ours, flatten(build_model(cfg).shapes), f"timm state dict vs {cfg.name} at "
                  f"{cfg.image_size[0]}x{cfg.image_size[1]}")
    return cfg, unflatten(ours)


def to_swin_timm(params: dict[str, Any], cfg: SwinConfig) -> dict[str, np.ndarray]:
    """timm's state dict (PyTorch layouts) of our parameters."""
    from vit_jax.models.build import build_model

    flat = {k: np.asarray(v) for k, v in flatten(params).items()}
    check_against(flat, flatten(build_model(cfg).shapes), f"parameters vs {cfg.name}")
    out = {"patch_embed.proj.weight": flat["patch_embed/kernel"].transpose(3, 2, 0, 1),
           "patch_embed.proj.bias": flat["patch_embed/bias"]}
    for mine, theirs in _pairs(cfg):
        if mine.endswith(("norm", "norm1", "norm2")):
            out[f"{theirs}.weight"], out[f"{theirs}.bias"] = flat[f"{mine}/scale"], flat[f"{mine}/bias"]
        else:
            out[f"{theirs}.weight"], out[f"{theirs}.bias"] = flat[f"{mine}/kernel"].T, flat[f"{mine}/bias"]
    for s, depth in enumerate(cfg.depths):
        dim = cfg.stage_dim(s)
        if s:
            out[f"layers.{s}.downsample.reduction.weight"] = flat[f"stage{s}/downsample/reduction"].T
        for b in range(depth):
            mine, theirs = f"stage{s}/block{b}/attn", f"layers.{s}.blocks.{b}.attn"
            qkv = np.stack([flat[f"{mine}/{n}/kernel"] for n in ("query", "key", "value")], axis=1)
            out[f"{theirs}.qkv.weight"] = qkv.reshape(dim, 3 * dim).T
            out[f"{theirs}.qkv.bias"] = np.stack([flat[f"{mine}/{n}/bias"] for n in ("query", "key", "value")]
                                                 ).reshape(3 * dim)
            out[f"{theirs}.proj.weight"] = flat[f"{mine}/out/kernel"].reshape(dim, dim).T
            out[f"{theirs}.proj.bias"] = flat[f"{mine}/out/bias"]
            out[f"{theirs}.{TABLE}"] = flat[f"{mine}/rel_bias"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def timm_swin_kwargs(cfg: SwinConfig) -> dict[str, Any]:
    """`timm.models.swin_transformer.SwinTransformer(**kwargs)` arguments of the model these weights fit."""
    return dict(img_size=list(cfg.image_size), patch_size=list(cfg.patch_size), window_size=cfg.window_size,
                embed_dim=cfg.embed_dim, depths=list(cfg.depths), num_heads=list(cfg.num_heads),
                mlp_ratio=cfg.mlp_ratio, num_classes=cfg.num_classes)


def save_swin_timm(path: str, params: dict[str, Any], cfg: SwinConfig) -> None:
    from safetensors.numpy import save_file

    recorded = {"image_size": list(cfg.image_size), "window_size": cfg.window_size, "ln_eps": cfg.ln_eps,
                "head_bias_init": cfg.head_bias_init}
    save_file(to_swin_timm(params, cfg), path, metadata={"format": "pt", "timm_swin_kwargs": json.dumps(
        timm_swin_kwargs(cfg)), "vit_jax_swin_config": json.dumps(recorded)})


def is_swin_timm_file(path: str) -> bool:
    """Whether a .safetensors file holds a timm Swin (reads the header only)."""
    from safetensors import safe_open

    with safe_open(path, "np") as f:
        return f"layers.0.blocks.0.attn.{TABLE}" in f.keys()


def load_swin_timm(path: str, *, fallback_image_size=None, **_) -> tuple[SwinConfig, dict[str, Any]]:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(path, "np") as f:
        meta = f.metadata() or {}
    recorded = json.loads(meta["vit_jax_swin_config"]) if "vit_jax_swin_config" in meta else None
    return from_swin_timm(load_file(path), recorded, fallback_image_size=fallback_image_size)


def export(cfg: SwinConfig, params: dict[str, Any], dst: str,
           request: formats.ExportRequest) -> tuple[SwinConfig, list[str], str]:
    """timm safetensors, at another recorded resolution and/or with a new zero-initialised head on request."""
    if request.to != "timm" or request.drop_pre_logits:
        raise formats.ExportError("a Swin exports to timm's layout only (--to timm) and has no pre-logits layer")
    notes = []
    if request.image_size:
        target = cfg.replace(image_size=request.image_size)
        if any(target.stage_window(s)[0] != cfg.stage_window(s)[0] for s in range(len(cfg.depths))):
            raise formats.ExportError(f"at {request.image_size[0]}x{request.image_size[1]} a stage of {cfg.name} is "
                                      "smaller than its window and the window shrinks: fine-tune at that size "
                                      "(init.checkpoint resizes the bias tables) instead of converting")
        cfg = target  # no absolute position embedding: the parameters do not depend on the resolution
        notes.append(f"image size recorded as {cfg.image_size[0]}x{cfg.image_size[1]} (no parameter depends on it)")
    if request.num_classes is not None:
        cfg = cfg.replace(num_classes=request.num_classes)
        params = {k: v for k, v in params.items() if k != "head"}
        if request.num_classes:
            dtype = params["norm"]["scale"].dtype
            params["head"] = {"kernel": np.zeros((cfg.num_features, cfg.num_classes), dtype),
                              "bias": np.zeros((cfg.num_classes,), dtype)}
        notes.append(f"head: replaced by a zero-initialised one of {request.num_classes} classes")
    save_swin_timm(dst, params, cfg)
    return cfg, notes, "timm layout"


formats.register_reader(formats.Reader(
    family="Swin", suffix=".safetensors", recognise=is_swin_timm_file, load=load_swin_timm,
    reads="timm swin_* .safetensors", signature=("patch_embed.proj.weight", f"layers.0.blocks.0.attn.{TABLE}",
                                                 "layers.0.blocks.0.attn.qkv.weight")))
formats.register_exporter(formats.Exporter(family="Swin", targets=("timm",), export=export))
