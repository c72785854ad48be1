"""Fixtures of the storage tests, on the session's `gcs` (tests/conftest.py: a real GCS API server behind FaultProxy)."""

from __future__ import annotations

import pytest


@pytest.fixture
def proxy(gcs):
    """The session's proxy, with no faults and no latency when the test ends."""
    yield gcs.proxy
    gcs.proxy.clear()
    gcs.proxy.latency_s = 0.0


@pytest.fixture
def fresh_url(gcs, request) -> str:
    """A bucket folder of this test's own."""
    return f"{gcs.bucket}/{request.node.name.replace('[', '_').replace(']', '')}"
