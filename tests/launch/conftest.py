"""Fixtures for the launcher tests: the digits dataset prepared once per session, the uninterrupted reference runs,
and the local SLURM cluster (jobs killed at teardown: tests/conftest.py's start_job)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch.helpers import STEPS, one_and_two_processes


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory) -> str:
    """The digits dataset built once for the session, so that no two processes race to build it."""
    from vit_jax.data import pipeline

    path = tmp_path_factory.mktemp("tfds")
    pipeline.open_dataset("digits", data_dir=str(path))
    return str(path)


@pytest.fixture(scope="session")
def uninterrupted(digits_dir, tmp_path_factory) -> dict[str, Path]:
    """The same training run as 1 process x 4 devices and as 2 processes x 2 devices (global batch 32 both): the
    reference of the local launcher's and the SLURM launcher's interrupted runs."""
    return one_and_two_processes(tmp_path_factory.mktemp("uninterrupted"), digits_dir, STEPS)


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
