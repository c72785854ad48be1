"""Fixtures for the launcher tests: the digits dataset prepared once per session (jobs: tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory) -> str:
    """The digits dataset built once for the session, so that no two processes race to build it."""
    from vit_jax.data import pipeline

    path = tmp_path_factory.mktemp("tfds")
    pipeline.open_dataset("digits", data_dir=str(path))
    return str(path)
