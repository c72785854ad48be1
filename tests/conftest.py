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


@pytest.fixture(scope="session")
def mosaic_data_dir(tmp_path_factory) -> str:
    """A TFDS data_dir with the generated digits_mosaic segmentation set built once for the whole session."""
    from vit_jax.data import pipeline

    path = str(tmp_path_factory.mktemp("tfds_mosaic"))
    pipeline.open_dataset("digits_mosaic", data_dir=path, prepare=True)
    return path


# `make test` runs the suite on two pytest-xdist workers with --dist loadgroup: each test file is one group (its
# module fixtures are built once), and files that share an expensive session fixture form one group, so that the
# fixture is not built on both workers: the uninterrupted 1- and 2-process reference runs of the local and the SLURM
# launcher tests.
SHARED_GROUPS = {
    "tests/launch/test_multiprocess_training.py": "two_process", "tests/launch/test_slurm_cluster.py": "two_process",
}
# The longest groups go first (longest-processing-time-first scheduling), so no long one starts last and leaves one
# worker idle at the end. Measured on 2 cores (2026-12-02); the other files follow in collection order.
LONGEST_FIRST = ("tests/storage/test_pod_storage.py", "two_process", "tests/train/test_trainer.py", "tests/test_demo.py",
                 "tests/train/test_resume.py", "tests/checkpoints/test_checkpoint_failures.py", "tests/train/test_step.py")


def pytest_collection_modifyitems(config, items):
    def group(item) -> str:
        path = Path(item.fspath).relative_to(ROOT).as_posix()
        return SHARED_GROUPS.get(path, path)

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(group(item), len(rank)))
