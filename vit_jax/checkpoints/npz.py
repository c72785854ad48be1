"""Loading and saving ViT parameters as `.npz` files in the official or big_vision layout.

`load_npz_params(path)` infers the architecture from the arrays alone and returns `(ViTConfig, params)` with params in
our nested layout, checked key-by-key and shape-by-shape against the model the config describes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vit_jax.checkpoints.layouts import (check_against, detect_layout, flatten, from_layout, infer_config, load_npz,
                                         save_npz, to_layout, unflatten)
from vit_jax.models.config import ViTConfig


def expected_flat_shapes(cfg: ViTConfig) -> dict[str, Any]:
    from vit_jax.models.vit import FunctionalViT

    return flatten(FunctionalViT(cfg).shapes)


def load_npz_params(path: str, cfg: ViTConfig | None = None, **infer_kw: Any) -> tuple[ViTConfig, dict[str, Any]]:
    """Reads an official/big_vision .npz. With `cfg=None` the architecture is inferred from the checkpoint.

    What was left out of the file (a train checkpoint's optimizer state) is printed and named in any mismatch error.
    """
    notes: list[str] = []
    raw = load_npz(path, notes)
    for note in notes:
        print(f"{path}: {note}")
    if cfg is None:
        cfg = infer_config(raw, **infer_kw)
    flat = from_layout(raw, cfg)
    source = "; ".join([f"{detect_layout(raw)} layout", *notes])
    check_against(flat, expected_flat_shapes(cfg), f"{path} ({source}) vs {cfg.name}")
    return cfg, unflatten(flat)


def save_npz_params(path: str, params: dict[str, Any], cfg: ViTConfig, layout: str = "official") -> None:
    flat = {k: np.asarray(v) for k, v in flatten(params).items()}
    check_against(flat, expected_flat_shapes(cfg), f"parameters vs {cfg.name}")
    save_npz(path, to_layout(flat, cfg, layout))
