"""BiT ResNet-v2 checkpoints: the official big_transfer `.npz` releases and timm `resnetv2_*_bit` state dicts.

big_transfer (BiT-M-R50x1.npz, ...), TF layout, optionally under a `resnet/` prefix:
  `root_block/standardized_conv2d/kernel` (7, 7, 3, C), `block{s}/unit{uu:02d}/{a,b,c}/group_norm/{gamma,beta}` (the
  norm *before* conv a/b/c), `block{s}/unit{uu}/{a,b,c}/standardized_conv2d/kernel`,
  `block{s}/unit{uu}/a/proj/standardized_conv2d/kernel`, `group_norm/{gamma,beta}`, `head/conv2d/{kernel,bias}`
  (a 1x1 conv (1, 1, C, K)).
timm (`resnetv2_50x1_bit` etc., PyTorch layouts: conv (out, in, kh, kw)):
  `stem.conv.weight`, `stages.{s-1}.blocks.{u-1}.{norm1,conv1,norm2,conv2,norm3,conv3}.*`,
  `stages.{s-1}.blocks.{u-1}.downsample.conv.weight`, `norm.{weight,bias}`, `head.fc.{weight,bias}` (a 1x1 conv).

The architecture (units per stage, width factor, classes) is read from the keys and shapes. The two sources differ
in their epsilons (big_transfer: GroupNorm 1e-6, weight standardisation 1e-10; timm: 1e-5, 1e-8): a loaded model
keeps its source's, so it computes the function it was trained as; our timm files record ours in their metadata.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from vit_jax.checkpoints import formats
from vit_jax.checkpoints.layouts import (CheckpointMismatchError, check_against, flatten, load_npz, save_npz,
                                         unflatten)
from vit_jax.models.bit_config import BIT_GN_EPS, BIT_WS_EPS, TIMM_GN_EPS, TIMM_WS_EPS, BiTConfig

NPZ_PREFIX = "resnet/"
# Our unit sub-paths -> (big_transfer, timm) names.
_UNIT_NAMES = {
    "gn1": ("a/group_norm", "norm1"), "conv1": ("a/standardized_conv2d", "conv1"),
    "gn2": ("b/group_norm", "norm2"), "conv2": ("b/standardized_conv2d", "conv2"),
    "gn3": ("c/group_norm", "norm3"), "conv3": ("c/standardized_conv2d", "conv3"),
    "conv_proj": ("a/proj/standardized_conv2d", "downsample.conv"),
}


def _layers_from(keys, pattern: str) -> tuple[int, ...]:
    """Units per stage from keys matching `pattern` (groups: stage, unit), checked to be numbered without gaps."""
    units: dict[int, set[int]] = {}
    for k in keys:
        if m := re.match(pattern, k):
            units.setdefault(int(m[1]), set()).add(int(m[2]))
    stages = sorted(units)
    if not stages or stages != list(range(stages[0], stages[0] + len(stages))):
        raise CheckpointMismatchError(f"BiT checkpoint stages are missing or not numbered consecutively: {stages}")
    for s in stages:
        if sorted(units[s]) != list(range(min(units[s]), min(units[s]) + len(units[s]))):
            raise CheckpointMismatchError(f"BiT checkpoint stage {s} has units {sorted(units[s])} (a gap)")
    return tuple(len(units[s]) for s in stages)


def _config(layers, root_out: int, num_classes: int, image_size, **eps) -> BiTConfig:
    if root_out % 64:
        raise CheckpointMismatchError(f"BiT root convolution has {root_out} channels, not a multiple of 64")
    return BiTConfig(layers=layers, width_factor=root_out // 64, num_classes=num_classes,
                     image_size=_size(image_size), **eps)


def _size(image_size) -> tuple[int, int]:
    if image_size is None:
        return (224, 224)  # BiT's parameters do not depend on it; the resolution the models are described at
    return (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)


def _unit_keys(cfg: BiTConfig):
    """(our unit path, stage, unit) for every unit, and whether it has a projection."""
    cin = cfg.width
    for s, units in enumerate(cfg.layers, 1):
        cout = 4 * cfg.width * 2 ** (s - 1)
        for u in range(1, units + 1):
            yield f"block{s}/unit{u}", s, u, (cin != cout or (u == 1 and s > 1))
            cin = cout


def expected_flat_shapes(cfg: BiTConfig) -> dict[str, Any]:
    from vit_jax.models.build import build_model

    return flatten(build_model(cfg).shapes)


def _names(cfg: BiTConfig, layout: str) -> dict[str, str]:
    """Our flat parameter names -> the "npz" (big_transfer, without `resnet/`) or "timm" names, for this model."""
    npz = layout == "npz"
    names = {"conv_root/kernel": "root_block/standardized_conv2d/kernel" if npz else "stem.conv.weight"}
    norm_leaves = {"scale": "gamma", "bias": "beta"} if npz else {"scale": "weight", "bias": "bias"}
    sep, kernel = ("/", "kernel") if npz else (".", "weight")
    final_norm = "group_norm" if npz else "norm"
    names.update({f"norm/{leaf}": f"{final_norm}{sep}{theirs}" for leaf, theirs in norm_leaves.items()})
    if cfg.num_classes:
        head = "head/conv2d" if npz else "head.fc"
        names.update({"head/kernel": f"{head}{sep}{kernel}", "head/bias": f"{head}{sep}bias"})
    for ours, s, u, proj in _unit_keys(cfg):
        theirs = f"block{s}/unit{u:02d}" if npz else f"stages.{s - 1}.blocks.{u - 1}"
        for sub, by_layout in _UNIT_NAMES.items():
            if sub == "conv_proj" and not proj:
                continue
            name = by_layout[0 if npz else 1]
            if sub.startswith("gn"):
                names.update({f"{ours}/{sub}/{leaf}": f"{theirs}{sep}{name}{sep}{t}"
                              for leaf, t in norm_leaves.items()})
            else:
                names[f"{ours}/{sub}/kernel"] = f"{theirs}{sep}{name}{sep}{kernel}"
    return names


# ---------------------------------------------------------------------------------------------------------------------
# big_transfer .npz

def from_bit_npz(raw: dict[str, np.ndarray], *, fallback_image_size=None) -> tuple[BiTConfig, dict[str, Any]]:
    """big_transfer arrays (with or without the `resnet/` prefix) -> (BiTConfig, our nested params)."""
    flat = {k[len(NPZ_PREFIX):] if k.startswith(NPZ_PREFIX) else k: v for k, v in raw.items()}
    layers = _layers_from(flat, r"block(\d+)/unit(\d+)/")
    head = flat.get("head/conv2d/kernel")
    cfg = _config(layers, flat["root_block/standardized_conv2d/kernel"].shape[-1],
                  0 if head is None else head.shape[-1], fallback_image_size, gn_eps=BIT_GN_EPS, ws_eps=BIT_WS_EPS)
    names = _names(cfg, "npz")
    missing = sorted(theirs for theirs in names.values() if theirs not in flat)
    unexpected = sorted(set(flat) - set(names.values()))
    if missing or unexpected:
        raise CheckpointMismatchError(f"BiT .npz vs {cfg.name}: missing {missing[:8]}, unexpected {unexpected[:8]}")
    ours = {k: np.asarray(flat[theirs]) for k, theirs in names.items()}
    if "head/kernel" in ours:
        ours["head/kernel"] = ours["head/kernel"].reshape(ours["head/kernel"].shape[-2:])
    check_against(ours, expected_flat_shapes(cfg), f"BiT .npz vs {cfg.name}")
    return cfg, unflatten(ours)


def save_bit_npz(path: str, params: dict[str, Any], cfg: BiTConfig) -> None:
    """Writes the big_transfer layout (`resnet/...`), which big_transfer and timm's npz loader read."""
    flat = {k: np.asarray(v) for k, v in flatten(params).items()}
    check_against(flat, expected_flat_shapes(cfg), f"parameters vs {cfg.name}")
    out = {NPZ_PREFIX + theirs: flat[ours] for ours, theirs in _names(cfg, "npz").items()}
    if cfg.num_classes:
        out[NPZ_PREFIX + "head/conv2d/kernel"] = flat["head/kernel"][None, None]
    save_npz(path, out)


# ---------------------------------------------------------------------------------------------------------------------
# timm state dicts

def from_bit_timm(sd: dict[str, np.ndarray], meta: dict[str, Any] | None = None, *,
                  fallback_image_size=None) -> tuple[BiTConfig, dict[str, Any]]:
    """timm `resnetv2_*_bit` state dict -> (BiTConfig, our nested params). `meta`: our export's recorded config."""
    layers = _layers_from(sd, r"stages\.(\d+)\.blocks\.(\d+)\.")
    head = sd.get("head.fc.weight")
    meta = dict(meta or {})
    image_size = meta.pop("image_size", None) or fallback_image_size
    eps = {k: meta[k] for k in ("gn_eps", "ws_eps") if k in meta} or dict(gn_eps=TIMM_GN_EPS, ws_eps=TIMM_WS_EPS)
    cfg = _config(layers, sd["stem.conv.weight"].shape[0], 0 if head is None else head.shape[0], image_size, **eps)
    names = _names(cfg, "timm")
    missing = sorted(theirs for theirs in names.values() if theirs not in sd)
    unexpected = sorted(set(sd) - set(names.values()))
    if missing or unexpected:
        raise CheckpointMismatchError(f"timm state dict vs {cfg.name}: missing {missing[:8]}, "
                                      f"unexpected {unexpected[:8]}")
    ours = {}
    for k, theirs in names.items():
        v = np.asarray(sd[theirs])
        if v.ndim == 4:
            v = v.transpose(2, 3, 1, 0)  # (out, in, kh, kw) -> (kh, kw, in, out)
            if k == "head/kernel":
                v = v[0, 0]
        ours[k] = np.ascontiguousarray(v)
    check_against(ours, expected_flat_shapes(cfg), f"timm state dict vs {cfg.name}")
    return cfg, unflatten(ours)


def to_bit_timm(params: dict[str, Any], cfg: BiTConfig) -> dict[str, np.ndarray]:
    flat = {k: np.asarray(v) for k, v in flatten(params).items()}
    check_against(flat, expected_flat_shapes(cfg), f"parameters vs {cfg.name}")
    out = {}
    for ours, theirs in _names(cfg, "timm").items():
        v = flat[ours]
        if ours == "head/kernel":
            v = v[None, None]
        out[theirs] = np.ascontiguousarray(v.transpose(3, 2, 0, 1) if v.ndim == 4 else v)
    return out


def timm_bit_kwargs(cfg: BiTConfig) -> dict[str, Any]:
    """`ResNetV2(**kwargs)` arguments of the timm model these weights fit (with timm's BiT stem and std-conv)."""
    return dict(layers=list(cfg.layers), width_factor=cfg.width_factor, num_classes=cfg.num_classes,
                stem_type="fixed", channels=[256 * 2 ** i for i in range(len(cfg.layers))])


def save_bit_timm(path: str, params: dict[str, Any], cfg: BiTConfig) -> None:
    from safetensors.numpy import save_file

    meta = {"format": "pt", "timm_bit_kwargs": json.dumps(timm_bit_kwargs(cfg)),
            "vit_jax_bit_config": json.dumps({"variant_name": cfg.name, "image_size": list(cfg.image_size),
                                              "gn_eps": cfg.gn_eps, "ws_eps": cfg.ws_eps})}
    save_file(to_bit_timm(params, cfg), path, metadata=meta)


def bit_meta(meta: dict[str, str]) -> dict[str, Any] | None:
    """Our recorded BiT config from a safetensors file's metadata (None for timm's own files)."""
    if "vit_jax_bit_config" not in meta:
        return None
    recorded = json.loads(meta["vit_jax_bit_config"])
    recorded.pop("variant_name", None)
    return recorded


def is_bit_timm_file(path: str) -> bool:
    """Whether a .safetensors file holds a timm ResNetV2 (reads the header only)."""
    from safetensors import safe_open

    with safe_open(path, "np") as f:
        return "stem.conv.weight" in f.keys()


def load_bit_timm(path: str, *, fallback_image_size=None) -> tuple[BiTConfig, dict[str, Any]]:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(path, "np") as f:
        meta = f.metadata() or {}
    return from_bit_timm(load_file(path), bit_meta(meta), fallback_image_size=fallback_image_size)


# ---------------------------------------------------------------------------------------------------------------------
# On the checkpoint-format registry (checkpoints/formats.py): BiT's readers and `vit-jax convert`'s exporter.

def is_bit_npz_file(path: str) -> bool:
    """Whether an .npz holds a big_transfer ResNet (reads the archive's names only; local or remote)."""
    import zipfile

    from etils import epath

    try:
        with epath.Path(path).open("rb") as f:
            return any("root_block/standardized_conv2d/kernel" in n for n in zipfile.ZipFile(f).namelist())
    except (OSError, zipfile.BadZipFile):
        return False  # not ours to read: formats.describe_unrecognised names what is wrong


def load_bit_npz(path: str, *, fallback_image_size=None, **_) -> tuple[BiTConfig, dict[str, Any]]:
    notes: list[str] = []
    raw = load_npz(path, notes)
    for note in notes:
        print(f"{path}: {note}")
    return from_bit_npz(raw, fallback_image_size=fallback_image_size)


def export(cfg: BiTConfig, params: dict[str, Any], dst: str,
           request: formats.ExportRequest) -> tuple[BiTConfig, list[str], str]:
    """big_transfer .npz or timm safetensors, with a new zero-initialised head on request."""
    if request.to not in ("official", "timm") or request.drop_pre_logits:
        raise formats.ExportError("BiT ResNets have no big_vision layout and no pre-logits layer; use --to official "
                                  "(big_transfer layout) or --to timm")
    notes = []
    if request.image_size:  # BiT's parameters do not depend on the resolution: only the recorded size changes
        cfg = cfg.replace(image_size=request.image_size)
    if request.num_classes is not None:
        cfg = cfg.replace(num_classes=request.num_classes)
        params = {k: v for k, v in params.items() if k != "head"}
        if request.num_classes:
            dtype = params["norm"]["scale"].dtype  # zero-initialised, as BiT initialises its head
            params["head"] = {"kernel": np.zeros((cfg.out_channels, cfg.num_classes), dtype),
                              "bias": np.zeros((cfg.num_classes,), dtype)}
        notes.append(f"head: replaced by a zero-initialised one of {request.num_classes} classes")
    (save_bit_timm if request.to == "timm" else save_bit_npz)(dst, params, cfg)
    return cfg, notes, f"{'timm' if request.to == 'timm' else 'big_transfer'} layout"


formats.register_reader(formats.Reader(
    family="BiT", suffix=".npz", recognise=is_bit_npz_file, load=load_bit_npz, reads="big_transfer .npz",
    signature=("resnet/root_block/standardized_conv2d/kernel", "resnet/group_norm/gamma", "head/conv2d/kernel")))
formats.register_reader(formats.Reader(
    family="BiT", suffix=".safetensors", recognise=is_bit_timm_file,
    load=lambda path, **kw: load_bit_timm(path, fallback_image_size=kw.get("fallback_image_size")),
    reads="timm resnetv2 .safetensors", signature=("stem.conv.weight", "stages.0.blocks.0.conv1.weight",
                                                   "norm.weight", "head.fc.weight")))
formats.register_exporter(formats.Exporter(family="BiT", targets=("official", "timm"), export=export))
