"""Fixtures of the storage tests: a real GCS API server (gcp-storage-emulator) on localhost behind FaultProxy, for
the whole session. This process and the jobs it starts reach it through the proxy, exactly as users do: with
`STORAGE_EMULATOR_HOST` alone (vit_jax derives every client's settings from it)."""

from __future__ import annotations

import os
import types

import pytest

from tests.storage.helpers import BUCKET, DERIVED


@pytest.fixture(scope="session")
def gcs():
    from vit_jax import runtime
    from vit_jax.storage.emulator import Emulator, FaultProxy

    saved = {k: os.environ.get(k) for k in (*DERIVED, "STORAGE_EMULATOR_HOST")}
    with Emulator(bucket=BUCKET) as emulator, FaultProxy(emulator.url) as proxy:
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.url
        runtime.configure_storage_env()
        try:
            yield types.SimpleNamespace(emulator=emulator, proxy=proxy, bucket=f"gs://{BUCKET}")
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


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
