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


class BackgroundRun:
    """A training job started in the background; `result()` waits for it and returns its workdir."""

    def __init__(self, job, workdir: Path) -> None:
        self.job, self.workdir = job, workdir

    def result(self, timeout: float = 900) -> Path:
        code = self.job.finish(timeout=timeout)
        assert code == 0, self.job.tail()
        return self.workdir


@pytest.fixture(scope="session")
def local_demo(tmp_path_factory, digits_data_dir):
    """The README's demo (`make demo`: configs/demo.py) on local disk, started once per session when first asked
    for and left running in the background: tests/test_demo.py checks it, tests/storage compares a bucket run's
    accuracy with it."""
    from tests.launch.helpers import Job, trainer

    workdir = tmp_path_factory.mktemp("local_demo") / "demo"
    run = BackgroundRun(Job(trainer(f"--config={ROOT / 'configs' / 'demo.py'}", f"--workdir={workdir}",
                                    f"--config.data.data_dir={digits_data_dir}")), workdir)
    yield run
    run.job.kill()


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
