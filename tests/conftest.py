"""Test set-up: 8 simulated CPU devices (mesh tests run in-process) and the persistent compilation cache."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vit_jax.runtime import configure_jax  # noqa: E402

configure_jax(num_cpu_devices=8, cache_dir=ROOT / ".cache" / "xla")


GOLDEN = ROOT / "tests" / "assets" / "golden"  # copied from ../shared/golden (see the README there)
GOLDEN_CASES = ("tiny_token", "tiny_gap_rep", "tiny_hybrid")


@pytest.fixture
def start_job():
    """start_job(command, env=None) -> tests.launch.helpers.Job; every job still running at the end is killed."""
    from tests.launch.helpers import Job

    jobs: list = []

    def start(command: list[str], env: dict[str, str] | None = None):
        jobs.append(Job(command, env=env))
        return jobs[-1]

    yield start
    for job in jobs:
        job.kill()


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    return GOLDEN


@pytest.fixture(scope="session")
def digits_data_dir(tmp_path_factory) -> str:
    """A TFDS data_dir with the embedded digits dataset built once for the whole session."""
    from vit_jax.data import pipeline

    path = str(tmp_path_factory.mktemp("tfds_digits"))
    pipeline.open_dataset("digits", data_dir=path, prepare=True)
    return path
