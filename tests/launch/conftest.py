"""Fixtures for the launcher tests: the digits dataset prepared once per session, and jobs killed at teardown."""

from __future__ import annotations

import pytest

from tests.launch.helpers import Job


@pytest.fixture
def start_job():
    """start_job(command) -> Job; every job still running at the end of the test is killed."""
    jobs: list[Job] = []

    def start(command: list[str]) -> Job:
        jobs.append(Job(command))
        return jobs[-1]

    yield start
    for job in jobs:
        job.kill()


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory) -> str:
    """The digits dataset built once for the session, so that no two processes race to build it."""
    from vit_jax.data import pipeline

    path = tmp_path_factory.mktemp("tfds")
    pipeline.open_dataset("digits", data_dir=str(path))
    return str(path)
