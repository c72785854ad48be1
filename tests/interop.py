"""Oracles from other frameworks (timm and transformers on PyTorch): installed by the `interop` extra, which `make
test` installs.

A test that compares against one calls `require_timm()` (or `require_transformers()`): where the extra is not
installed (a plain `pip install -e '.[test]'`) the test is skipped with the install line, except under CI (CI set),
where a missing oracle fails the run instead of hiding behind a skip.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest


def require_timm() -> ModuleType:
    """timm, imported beside a CPU-only torch as vit_jax's timm peer imports it (vit_jax/bench/timm_import.py)."""
    from vit_jax.bench.timm_import import import_timm

    try:
        return import_timm()
    except ImportError as e:
        message = f"timm/torch, this test's oracle, is not installed ({e}): pip install -e '.[interop]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def require_transformers() -> ModuleType:
    """transformers (the ViViT oracle), imported beside a CPU-only torch as vit_jax/bench/timm_import.py imports it;
    skipped with the install line where absent, a failure under CI."""
    from vit_jax.bench.timm_import import import_transformers

    try:
        return import_transformers()
    except ImportError as e:
        message = f"transformers/torch, this test's oracle, is not installed ({e}): pip install -e '.[interop]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
