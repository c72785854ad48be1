"""Official checkpoint layouts <-> our parameter tree.

Two `.npz` layouts are read and written:
- "official": the ViT paper / vit_jax / AugReg release (`Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1`,
  `LayerNorm_0/2`, `MlpBlock_3`, the position embedding with its class-token row at
  `Transformer/posembed_input/pos_embedding`, hybrid stem at the top level as `conv_root`, `gn_root`, `block{s}/...`);
- "big_vision": top-level `pos_embedding` without a class-token row (added before the class token is concatenated),
  `MultiHeadDotProductAttention_0`, `LayerNorm_0/1`, `MlpBlock_0`, either unrolled `encoderblock_{i}` or scan-stacked
  `encoderblock`, and `MAPHead_0` for attention pooling. Files may carry a `params/` or `opt/target/` prefix;
  a train checkpoint's optimizer state next to it is ignored.

Our tree stores the encoder blocks stacked (leading depth axis) under `encoder/blocks`; everything else is a rename.
Arrays are never unpickled (`allow_pickle=False`), and every mismatch is reported at once.
"""

from __future__ import annotations

import io
import math
import os
import re
import zipfile
from typing import Any

import numpy as np

from vit_jax.errors import UserError, one_line
from vit_jax.models.config import ViTConfig, stem_stride

# Sub-paths of one encoder block: ours -> (official, big_vision).
_BLOCK_NAMES = {
    "ln1": ("LayerNorm_0", "LayerNorm_0"),
    "attn": ("MultiHeadDotProductAttention_1", "MultiHeadDotProductAttention_0"),
    "ln2": ("LayerNorm_2", "LayerNorm_1"),
    "mlp/fc1": ("MlpBlock_3/Dense_0", "MlpBlock_0/Dense_0"),
    "mlp/fc2": ("MlpBlock_3/Dense_1", "MlpBlock_0/Dense_1"),
}
# MAP head (big_vision names; the official release has no MAP models but we write the same names there).
_MAP_NAMES = {"probe": "probe", "attn": "MultiHeadDotProductAttention_0", "ln": "LayerNorm_0",
              "mlp/fc1": "MlpBlock_0/Dense_0", "mlp/fc2": "MlpBlock_0/Dense_1"}
_PREFIXES = ("opt/target/", "params/img/", "params/")
_STEM_GROUPNORM = re.compile(r"(gn_root|block\d+/unit\d+/gn(\d|_proj))/(scale|bias)")
LAYOUTS = ("official", "big_vision")


class CheckpointMismatchError(UserError, ValueError):
    """A checkpoint does not fit the model; the message lists every missing, unexpected and mis-shaped key."""


class CheckpointReadError(UserError, ValueError):
    """A checkpoint file is missing, damaged, or holds what we refuse to read (pickled objects)."""


class ImageSizeRequiredError(CheckpointMismatchError):
    """The arrays do not record the input resolution (fixed sin-cos posemb, or a non-square patch grid).

    `reason` is kept apart so that a command can name its own flag in the one-line fix."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"{reason}; pass image_size")


# ---------------------------------------------------------------------------------------------------------------------
# Flat/nested helpers and npz I/O.

def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}/"))
        elif v is not None:
            out[f"{prefix}{k}"] = v
    return out


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in flat.items():
        node = out
        *parents, leaf = k.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def load_npz(path: str, notes: list[str] | None = None) -> dict[str, np.ndarray]:
    """Reads an .npz (local path or any etils/gfile path) into a flat dict, stripping known wrapper prefixes.

    When only part of the file sits under a prefix (a train checkpoint: `opt/target/...` next to `opt/state/...`,
    or big_vision's `params/...` next to `opt/...`), the model is the part under it; the rest is ignored and a line
    saying so is appended to `notes`.
    """
    if not os.path.exists(path):
        from etils import epath  # remote paths (gs://...) go through etils

        p = epath.Path(path)
        if not p.exists():
            raise CheckpointReadError(f"checkpoint {path} does not exist")
        data = io.BytesIO(p.read_bytes())
    else:
        data = path
    try:
        with np.load(data, allow_pickle=False) as z:
            flat = {k: np.asarray(z[k]) for k in z.files}
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise CheckpointReadError(f"{path} holds pickled Python objects, which vit_jax never loads (they can run "
                                      "code); save the arrays with numpy.savez instead") from e
        raise CheckpointReadError(f"{path} is not a readable .npz of arrays ({one_line(e)})") from e
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointReadError(f"{path} is not a readable .npz of arrays ({one_line(e)}); is it truncated?") from e
    for prefix in _PREFIXES:
        inside = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
        if inside and (len(inside) == len(flat) or "embedding/kernel" in inside):
            if len(inside) < len(flat) and notes is not None:
                rest = "optimizer state, text tower" if prefix == "params/img/" else "optimizer state"
                notes.append(f"read the model under '{prefix}'; ignored the {len(flat) - len(inside)} other entries "
                             f"({rest})")
            flat = inside
            break
    return flat


def save_npz(path: str, flat: dict[str, np.ndarray]) -> None:
    """Writes atomically (temp file + rename) so a crash never leaves a truncated checkpoint."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **{k: np.asarray(v) for k, v in flat.items()})
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------------------
# Layout detection and architecture inference.

def detect_layout(flat: dict[str, np.ndarray]) -> str:
    if "embedding/kernel" not in flat:
        raise CheckpointMismatchError(
            "not a ViT checkpoint: no 'embedding/kernel' (keys start with: "
            f"{sorted(flat)[:5]})")
    if "pos_embedding" in flat or "Transformer/encoderblock/LayerNorm_0/scale" in flat or any(
            k.startswith("Transformer/encoderblock_") and "/MultiHeadDotProductAttention_0/" in k for k in flat):
        return "big_vision"
    return "official"


def _block_prefixes(flat, layout):
    if "Transformer/encoderblock/LayerNorm_0/scale" in flat:
        return None  # scan-stacked
    idx = sorted({int(m.group(1)) for k in flat if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))})
    if idx != list(range(len(idx))):
        raise CheckpointMismatchError(f"encoder blocks are not numbered 0..N-1: {idx}")
    return [f"Transformer/encoderblock_{i}/" for i in idx]


def infer_config(flat: dict[str, np.ndarray], image_size: int | tuple[int, int] | None = None, *,
                 fallback_image_size: int | tuple[int, int] | None = None, **overrides: Any) -> ViTConfig:
    """The architecture of a checkpoint, read from the arrays alone (no config needed).

    `image_size` overrides the resolution; `fallback_image_size` is used only where the arrays do not record one
    (without either, such a checkpoint raises ImageSizeRequiredError).
    """
    layout = detect_layout(flat)
    li = LAYOUTS.index(layout)
    ph, pw, cin, width = flat["embedding/kernel"].shape
    prefixes = _block_prefixes(flat, layout)
    attn = _BLOCK_NAMES["attn"][li]
    mlp1 = _BLOCK_NAMES["mlp/fc1"][li]
    if prefixes is None:
        depth = flat["Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
        q = flat[f"Transformer/encoderblock/{attn}/query/kernel"][0]
        m = flat[f"Transformer/encoderblock/{mlp1}/kernel"][0]
    else:
        depth = len(prefixes)
        if not depth:
            raise CheckpointMismatchError("checkpoint has no Transformer encoder blocks")
        q = flat[f"{prefixes[0]}{attn}/query/kernel"]
        m = flat[f"{prefixes[0]}{mlp1}/kernel"]
    pool = "token" if "cls" in flat else ("map" if "MAPHead_0/probe" in flat else "gap")
    resnet_layers: tuple[int, ...] = ()
    resnet_width = 1
    if "conv_root/kernel" in flat:
        stages = []
        s = 1
        while any(k.startswith(f"block{s}/") for k in flat):
            stages.append(len({k.split("/")[1] for k in flat if k.startswith(f"block{s}/unit")}))
            s += 1
        resnet_layers = tuple(stages) or (0,)  # no block{s}: the root-only stem (official R+ViT-Ti)
        resnet_width = flat["conv_root/kernel"].shape[-1] // 64
    pe_key = "pos_embedding" if layout == "big_vision" else "Transformer/posembed_input/pos_embedding"
    posemb = "learn" if pe_key in flat else "sincos2d"
    if image_size is None:
        unrecorded = None
        if posemb != "learn":
            unrecorded = "this checkpoint has fixed sin-cos position embeddings, so its resolution is not recorded"
        else:
            n = flat[pe_key].shape[1] - (1 if (pool == "token" and layout == "official") else 0)
            g = math.isqrt(n)
            if g * g == n:
                s = stem_stride(resnet_layers)
                image_size = (g * ph * s, g * pw * s)
            else:
                unrecorded = f"position embedding has {n} patch rows (not a square grid), so the image shape is unknown"
        if unrecorded:
            if fallback_image_size is None:
                raise ImageSizeRequiredError(unrecorded)
            image_size = fallback_image_size
    kw: dict[str, Any] = dict(
        width=width, depth=depth, num_heads=q.shape[1], mlp_dim=m.shape[1], patch_size=(ph, pw), pool=pool,
        posemb=posemb, rep_size=flat["pre_logits/kernel"].shape[1] if "pre_logits/kernel" in flat else 0,
        num_classes=flat["head/kernel"].shape[1] if "head/kernel" in flat else 0,
        resnet_layers=resnet_layers, resnet_width=resnet_width, image_size=image_size)
    kw.update(overrides)
    from vit_jax.models.config import vit_config

    return vit_config(**kw)


# ---------------------------------------------------------------------------------------------------------------------
# Conversion.

def from_layout(flat: dict[str, np.ndarray], cfg: ViTConfig) -> dict[str, np.ndarray]:
    """Official or big_vision flat dict -> our flat dict (keys like `encoder/blocks/attn/query/kernel`)."""
    layout = detect_layout(flat)
    li = LAYOUTS.index(layout)
    src = dict(flat)
    out: dict[str, np.ndarray] = {}

    def take(key):
        if key not in src:
            missing.append(key)
            return None
        return src.pop(key)

    missing: list[str] = []
    for k in ("embedding/kernel", "embedding/bias"):
        out[k] = take(k)
    if cfg.pool == "token":
        out["cls"] = take("cls")
    if cfg.posemb == "learn":
        if layout == "official":
            out["pos_embedding"] = take("Transformer/posembed_input/pos_embedding")
        else:
            pe = take("pos_embedding")
            if pe is not None and cfg.pool == "token":
                # big_vision adds the position embedding before concatenating the class token: an all-zero class row
                # in our (official) convention is exactly equivalent.
                pe = np.concatenate([np.zeros_like(pe[:, :1]), pe], axis=1)
            out["pos_embedding"] = pe
    prefixes = _block_prefixes(flat, layout)
    for ours, names in _BLOCK_NAMES.items():
        name = names[li]
        for leaf in _leaves_of(ours):
            if prefixes is None:
                out[f"encoder/blocks/{ours}/{leaf}"] = take(f"Transformer/encoderblock/{name}/{leaf}")
            else:
                parts = [take(f"{p}{name}/{leaf}") for p in prefixes]
                out[f"encoder/blocks/{ours}/{leaf}"] = (np.stack(parts) if all(x is not None for x in parts)
                                                        else None)
    for leaf in ("scale", "bias"):
        out[f"encoder/norm/{leaf}"] = take(f"Transformer/encoder_norm/{leaf}")
    if cfg.pool == "map":
        for ours, name in _MAP_NAMES.items():
            for leaf in _leaves_of(ours):
                out[f"map_head/{ours}" + (f"/{leaf}" if leaf else "")] = take(
                    f"MAPHead_0/{name}" + (f"/{leaf}" if leaf else ""))
    if cfg.rep_size:
        for leaf in ("kernel", "bias"):
            out[f"pre_logits/{leaf}"] = take(f"pre_logits/{leaf}")
    if cfg.num_classes:
        for leaf in ("kernel", "bias"):
            out[f"head/{leaf}"] = take(f"head/{leaf}")
    if cfg.resnet_layers:
        for k in [k for k in src if k.split("/")[0] in ("conv_root", "gn_root") or re.match(r"block\d+/", k)]:
            value = src.pop(k)
            # The released hybrids (R50+ViT-B_16, AugReg R26/R50) store GroupNorm scale/bias as (1, 1, 1, C), ready
            # to broadcast over NHWC; ours are (C,) like every other norm, and (C,) is what we write back.
            if _STEM_GROUPNORM.fullmatch(k) and value.ndim == 4 and value.shape[:3] == (1, 1, 1):
                value = value.reshape(value.shape[-1])
            out[f"stem/{k}"] = value
    if missing or src:
        raise CheckpointMismatchError(
            f"{layout} checkpoint does not fit {cfg.name}: " + _describe(missing=missing, unexpected=sorted(src)))
    return out


def to_layout(ours: dict[str, np.ndarray], cfg: ViTConfig, layout: str = "official") -> dict[str, np.ndarray]:
    """Our flat dict -> official or big_vision flat dict (unrolled blocks, loadable by both code bases)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {LAYOUTS}")
    li = LAYOUTS.index(layout)
    src = {k: np.asarray(v) for k, v in ours.items()}
    out: dict[str, np.ndarray] = {}
    for k in ("embedding/kernel", "embedding/bias"):
        out[k] = src.pop(k)
    if "cls" in src:
        out["cls"] = src.pop("cls")
    if "pos_embedding" in src:
        pe = src.pop("pos_embedding")
        if layout == "official":
            out["Transformer/posembed_input/pos_embedding"] = pe
        else:
            if cfg.pool == "token":  # fold the class row into the class token (big_vision adds posemb first)
                out["cls"] = out["cls"] + pe[:, :1]
                pe = pe[:, 1:]
            out["pos_embedding"] = pe
    for ours_name, names in _BLOCK_NAMES.items():
        for leaf in _leaves_of(ours_name):
            stacked = src.pop(f"encoder/blocks/{ours_name}/{leaf}")
            for i in range(cfg.depth):
                out[f"Transformer/encoderblock_{i}/{names[li]}/{leaf}"] = stacked[i]
    for leaf in ("scale", "bias"):
        out[f"Transformer/encoder_norm/{leaf}"] = src.pop(f"encoder/norm/{leaf}")
    for k in [k for k in src if k.startswith("map_head/")]:
        sub = k[len("map_head/"):]
        ours_name = next(n for n in _MAP_NAMES if sub == n or sub.startswith(n + "/"))
        out[f"MAPHead_0/{_MAP_NAMES[ours_name]}{sub[len(ours_name):]}"] = src.pop(k)
    for k in [k for k in src if k.startswith("stem/")]:
        out[k[len("stem/"):]] = src.pop(k)
    for k in [k for k in src if k.split("/")[0] in ("pre_logits", "head")]:
        out[k] = src.pop(k)
    assert not src, f"unconverted parameters: {sorted(src)}"
    return out


def _leaves_of(ours: str) -> tuple[str, ...]:
    if ours in ("ln1", "ln2", "ln"):
        return ("scale", "bias")
    if ours == "attn":
        return tuple(f"{p}/{leaf}" for p in ("query", "key", "value", "out") for leaf in ("kernel", "bias"))
    if ours == "probe":
        return ("",)
    return ("kernel", "bias")


def _describe(*, missing=(), unexpected=(), mismatched=()) -> str:
    parts = []
    if missing:
        parts.append(f"missing {len(missing)}: {', '.join(missing)}")
    if unexpected:
        parts.append(f"unexpected {len(unexpected)}: {', '.join(unexpected)}")
    if mismatched:
        parts.append(f"shape mismatch {len(mismatched)}: {', '.join(mismatched)}")
    return "; ".join(parts)


def check_against(flat: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    """Raises one CheckpointMismatchError naming every missing, unexpected and mis-shaped key."""
    missing = sorted(set(expected) - set(flat))
    unexpected = sorted(set(flat) - set(expected))
    mismatched = sorted(f"{k} {tuple(flat[k].shape)} vs {tuple(expected[k].shape)}"
                        for k in set(flat) & set(expected) if tuple(flat[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or mismatched:
        raise CheckpointMismatchError(f"{what}: " + _describe(missing=missing, unexpected=unexpected,
                                                             mismatched=mismatched))
