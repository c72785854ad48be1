"""Oracles from other frameworks (timm and transformers on PyTorch): installed by the `interop` extra, which `make
test` installs.

A test that compares against one calls `require_timm()` (or `require_transformers()`, `require_open_clip()`): where
the extra is not installed (a plain `pip install -e '.[test]'`) the test is skipped with the install line, except
under CI (CI set), where a missing oracle fails the run instead of hiding behind a skip.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest


def _require(name: str) -> ModuleType:
    """`name` (timm, transformers or open_clip) imported beside a CPU-only torch (vit_jax/bench/timm_import.py);
    where it is absent: a skip with the install line, or under CI a failure."""
    from vit_jax.bench import timm_import

    try:
        return getattr(timm_import, f"import_{name}")()
    except ImportError as e:
        message = f"{name}/torch, this test's oracle, is not installed ({e}): pip install -e '.[interop]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def require_timm() -> ModuleType:
    """timm (the timm oracles), as vit_jax's timm peer imports it."""
    return _require("timm")


def require_transformers() -> ModuleType:
    """transformers (the ViViT and SigLIP oracles)."""
    return _require("transformers")


def require_open_clip() -> ModuleType:
    """open_clip (the SigLIP .npz oracle: open_clip's own big_vision loader)."""
    return _require("open_clip")
