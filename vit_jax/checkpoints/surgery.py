"""Fine-tune surgery (ViT paper §3.2): new head, dropped pre-logits, position embeddings resized to a new grid.

`adapt_params` merges pretrained parameters into a freshly initialised target model and returns a precise account
of every change; anything it cannot explain (a different width, a missing block, ...) is one loud error.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.checkpoints.layouts import CheckpointMismatchError, flatten, unflatten
from vit_jax.models.config import ViTConfig
from vit_jax.models.posemb_resize import resize_dinov2
from vit_jax.models.swin import resize_rel_bias_table
from vit_jax.models.windows import resize_rel_pos

RESIZE_METHODS = ("bicubic", "bilinear", "dinov2")  # dinov2: DINOv2's offset bicubic (models/posemb_resize.py)


def resize_posemb(posemb: np.ndarray, old_grid: tuple[int, int], new_grid: tuple[int, int], num_prefix: int,
                  method: str = "bicubic") -> np.ndarray:
    """Resizes a (1, prefix + gh*gw, D) position embedding to a new (rectangular) grid, prefix rows kept apart."""
    if method not in RESIZE_METHODS:
        raise ValueError(f"unknown position-embedding resize method {method!r}; use one of {RESIZE_METHODS}")
    posemb = np.asarray(posemb)
    prefix, grid = posemb[:, :num_prefix], posemb[0, num_prefix:]
    gh, gw = old_grid
    if grid.shape[0] != gh * gw:
        raise CheckpointMismatchError(f"position embedding has {grid.shape[0]} patch rows, not {gh}x{gw}")
    if tuple(old_grid) == tuple(new_grid):
        return posemb
    grid = grid.reshape(gh, gw, -1).astype(np.float32)
    if method == "dinov2":
        resized = resize_dinov2(grid, tuple(new_grid)).astype(posemb.dtype).reshape(1, new_grid[0] * new_grid[1], -1)
        return np.concatenate([prefix, resized], axis=1)
    # antialias=False: this is interpolation of a smooth field, not image downsampling (and it is the standard).
    resized = jax.image.resize(jnp.asarray(grid), (*new_grid, grid.shape[-1]), method=method, antialias=False)
    resized = np.asarray(resized, dtype=posemb.dtype).reshape(1, new_grid[0] * new_grid[1], -1)
    return np.concatenate([prefix, resized], axis=1)


def _is_rel_pos(key: str) -> bool:
    return key.startswith("encoder/rel_pos_")


def _is_swin_rel_bias(key: str) -> bool:
    """A Swin block's relative position bias table (models/swin.py), sized by its stage's window."""
    return key.startswith("stage") and key.endswith("/attn/rel_bias")


def _strip_for_dense(src: dict[str, np.ndarray], prefix: int, notes: list[str]) -> int:
    """Drops what a dense backbone lacks from flat source params (in place): the class token (and its position
    embedding row), the final LayerNorm and a MAP pooling head. Returns the position embedding's prefix rows left."""
    for key in [k for k in src if k == "cls" or k.startswith(("encoder/norm/", "map_head/"))]:
        notes.append(f"dropped {key} (a dense backbone has none)")
        src.pop(key)
    if prefix and "pos_embedding" in src:
        src["pos_embedding"] = src["pos_embedding"][:, prefix:]
        notes.append("dropped the class token's pos_embedding row")
    return 0


def adapt_params(loaded: dict[str, Any], loaded_cfg: ViTConfig, target_init: dict[str, Any], target_cfg: ViTConfig,
                 *, reinit: tuple[str, ...] = ("head",), posemb_method: str = "bicubic"
                 ) -> tuple[dict[str, Any], list[str]]:
    """Pretrained params -> params of `target_cfg`, starting from its fresh init `target_init`.

    - parameters under a `reinit` prefix (default: the head) keep their fresh (zero) initialisation;
    - a pre-logits layer the target lacks is dropped; one the target adds stays freshly initialised; so is a final
      LayerNorm (`norm`) the target lacks (a dense Swin's head normalises each stage);
    - the learned position embedding is resized to the target grid (class-token row kept apart), and relative
      position tables to the target's attention sizes (global blocks follow the grid; a Swin's bias tables to its
      stages' windows);
    - everything else must match in name and shape, or a CheckpointMismatchError lists every difference.
    Both configs are of one model family (a BiT ResNet's checkpoint fine-tunes a BiT ResNet), or a converter is
    registered from the checkpoint's family to the target's (checkpoints/formats.py Converter: an image ViT inflated
    into a video ViT), which runs first.
    """
    notes: list[str] = []
    if type(loaded_cfg) is not type(target_cfg):  # another family: a registered converter (formats.Converter) or none
        from vit_jax.checkpoints.formats import CONVERTERS
        from vit_jax.models.family import family_of

        converter = CONVERTERS.get((family_of(loaded_cfg).name, family_of(target_cfg).name))
        if converter is not None:
            loaded, notes = converter.convert(loaded_cfg, loaded, target_cfg, target_init)
            notes = [f"{loaded_cfg.name} -> {target_cfg.name}: {n}" for n in notes]
            loaded_cfg = dataclasses.replace(target_cfg, num_classes=loaded_cfg.num_classes)
    src = {k: np.asarray(v) for k, v in flatten(loaded).items()}
    dst = flatten(target_init)
    out: dict[str, Any] = {}
    missing, mismatched = [], []
    if type(loaded_cfg) is not type(target_cfg):
        raise CheckpointMismatchError(f"checkpoint holds a {loaded_cfg.name} but the config builds a {target_cfg.name} "
                                      "(another model family)")
    pooled = hasattr(target_cfg, "pool")  # a family with a pooling choice (and a class token with "token": a ViT)
    to_dense = pooled and target_cfg.dense and not loaded_cfg.dense
    # position-embedding rows of the class token (and of DeiT's distillation token)
    prefix = getattr(loaded_cfg, "num_prefix_tokens", int(loaded_cfg.pool == "token")) if pooled else 0
    if to_dense:  # a classifier's encoder as a dense backbone: no class token, final LayerNorm or pooling
        prefix = _strip_for_dense(src, prefix, notes)
    if pooled and not to_dense and loaded_cfg.pool != target_cfg.pool and not (
            {loaded_cfg.pool, target_cfg.pool} <= {"token", "gap"} and "pos_embedding" not in dst):
        raise CheckpointMismatchError(
            f"checkpoint pools with '{loaded_cfg.pool}' but the config asks for '{target_cfg.pool}'; set "
            f"model.pool='{loaded_cfg.pool}'")

    def under(key, prefixes):
        return any(key == p or key.startswith(p + "/") for p in prefixes)

    if not any(under(k, ("norm",)) for k in dst):  # a dense Swin normalises each stage in its head instead
        for key in sorted(k for k in src if under(k, ("norm",))):
            src.pop(key)
            notes.append(f"dropped {key} (the final LayerNorm; the target has none)")

    for key, init_value in dst.items():
        if under(key, reinit):
            out[key] = init_value
            if key in src:
                notes.append(f"re-initialised {key} {tuple(src.pop(key).shape)} -> {tuple(init_value.shape)}")
            else:  # e.g. the head of a fine-tune from a headless (MAE-pretrained) encoder
                notes.append(f"new {key} {tuple(init_value.shape)} (fresh init)")
            continue
        if key not in src:
            if under(key, ("pre_logits",)):
                out[key] = init_value
                notes.append(f"new {key} (fresh init)")
                continue
            missing.append(key)
            continue
        value = src.pop(key)
        if key == "pos_embedding" and value.shape != init_value.shape:
            value = resize_posemb(value, loaded_cfg.grid, target_cfg.grid, prefix, posemb_method)
            notes.append(f"resized pos_embedding {loaded_cfg.grid} -> {target_cfg.grid} ({posemb_method})")
        if _is_rel_pos(key) and value.shape[1:] == init_value.shape[1:] and value.shape != init_value.shape:
            notes.append(f"resized {key} {value.shape[0]} -> {init_value.shape[0]} rows (linear, as SAM "
                         "interpolates a table trained for another attention size)")
            value = np.asarray(resize_rel_pos(jnp.asarray(value), init_value.shape[0]))
        if _is_swin_rel_bias(key) and value.shape[1:] == init_value.shape[1:] and value.shape != init_value.shape:
            window = target_cfg.stage_window(int(key.split("/")[0].removeprefix("stage")))[0]
            notes.append(f"resized {key} {value.shape[0]} -> {init_value.shape[0]} rows (bicubic, for window "
                         f"{window[0]}x{window[1]})")
            value = resize_rel_bias_table(value, window)
        if tuple(value.shape) != tuple(init_value.shape):
            mismatched.append(f"{key} {tuple(value.shape)} vs {tuple(init_value.shape)}")
            continue
        out[key] = value.astype(init_value.dtype)
    for key in [k for k in src if under(k, reinit) or under(k, ("pre_logits",))]:
        src.pop(key)
        notes.append(f"dropped {key}")
    if missing or mismatched or src:
        parts = [f"missing {missing}" if missing else "", f"shape mismatch {mismatched}" if mismatched else "",
                 f"unexpected {sorted(src)}" if src else ""]
        raise CheckpointMismatchError(f"checkpoint {loaded_cfg.name} does not fit {target_cfg.name}: "
                                      + "; ".join(p for p in parts if p))
    return unflatten(out), notes
