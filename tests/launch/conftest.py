"""Fixtures for the launcher tests: the digits dataset prepared once per session, the uninterrupted reference runs,
and the local SLURM cluster (jobs killed at teardown: tests/conftest.py's start_job)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import build_once
from tests.launch.helpers import STEPS, one_and_two_processes


@pytest.fixture(scope="session")
def digits_dir(digits_data_dir) -> str:
    """The digits dataset built before any job starts, so that no two processes race to build it (tests/conftest.py:
    once per test run, shared with the in-process tests)."""
    return digits_data_dir


@pytest.fixture(scope="session")
def uninterrupted(digits_dir, tmp_path_factory) -> dict[str, Path]:
    """The same training run as 1 process x 4 devices and as 2 processes x 2 devices (global batch 32 both): the
    reference of the local launcher's and the SLURM launcher's interrupted runs. Run once per test run: under
    `make test` the multi-process and SLURM files run on different workers, which both need it."""
    root = build_once(tmp_path_factory, "uninterrupted",
                      lambda folder: one_and_two_processes(folder, digits_dir, STEPS))
    return {"one": root / "one", "two": root / "two"}


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A one-node SLURM cluster on localhost for the whole session (tests/launch/slurm_cluster.py); it cannot start
    without root and the Debian packages, and then every test using it errors with one line saying so."""
    from tests.launch.slurm_cluster import ClusterError, LocalSlurmCluster

    cluster = LocalSlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except ClusterError as e:
        pytest.fail(f"local SLURM cluster: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        stray = cluster.stop()
    assert not stray, f"processes of the local SLURM cluster outlived its jobs (killed now): {stray}"
