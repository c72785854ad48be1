"""Test set-up: 8 simulated CPU devices (mesh tests run in-process) and the persistent compilation cache."""

import fcntl
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.launch.helpers import TEST_XLA_FLAGS  # noqa: E402
from vit_jax.runtime import configure_jax  # noqa: E402

# The checkout's compilation cache, for this process and for every process a test starts (trainers, probes, sweep
# jobs: they inherit the environment), so a program compiled once in a run is loaded, not compiled, everywhere else.
# Without the variable those processes used ~/.cache/vit_jax/xla, another cache, cold on a fresh machine.
# VIT_JAX_TEST_CACHE_DIR=<empty folder> times the suite as a fresh clone runs it without emptying the shared one.
CACHE_DIR = Path(os.environ.get("VIT_JAX_TEST_CACHE_DIR") or ROOT / ".cache" / "xla")
os.environ["VIT_JAX_CACHE_DIR"] = str(CACHE_DIR)
os.environ["XLA_FLAGS"] = " ".join(filter(None, (os.environ.get("XLA_FLAGS"), TEST_XLA_FLAGS)))  # why: helpers.py
configure_jax(num_cpu_devices=8, cache_dir=CACHE_DIR)


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


def build_once(tmp_path_factory, name: str, build) -> Path:
    """The folder `name` filled by `build(folder)` once per test run, not once per pytest-xdist worker: the workers of
    a run share their base temporary folder's parent; the first to take the lock builds, the others wait and reuse
    what it built (a build that failed is redone by the next taker). A session fixture alone is per worker: `make
    test`'s three workers each built the same datasets and reference runs."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the build fails
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def _prepared(name: str):
    def build(folder: Path) -> None:
        from vit_jax.data import pipeline

        pipeline.open_dataset(name, data_dir=str(folder), prepare=True)

    return build


@pytest.fixture(scope="session")
def digits_data_dir(tmp_path_factory) -> str:
    """A TFDS data_dir with the embedded digits dataset built once for the whole run (read-only to the tests)."""
    return str(build_once(tmp_path_factory, "tfds_digits", _prepared("digits")))


@pytest.fixture(scope="session")
def mosaic_data_dir(tmp_path_factory) -> str:
    """A TFDS data_dir with the generated digits_mosaic segmentation set built once for the whole run."""
    return str(build_once(tmp_path_factory, "tfds_mosaic", _prepared("digits_mosaic")))


@pytest.fixture(scope="session")
def gcs():
    """A real GCS API server (gcp-storage-emulator) on localhost behind FaultProxy, for the rest of the session.
    This process and the jobs it starts reach it through the proxy, exactly as users do: with
    `STORAGE_EMULATOR_HOST` alone (vit_jax derives every client's settings from it)."""
    import types

    from tests.storage.helpers import BUCKET, DERIVED
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


# `make test` runs the suite on three pytest-xdist workers (on 2 cores: the multi-process tests spend part of their
# time waiting on each other, on SLURM or on retries; measured side by side on a cold cache, 2026-12-02: 1185 s with
# three workers against 1277 s with two, the CPUs 91% busy) with --dist loadfile: each test file runs on one worker, so
# its module fixtures are built once, and the SLURM tests never run two local clusters at once (their jobs would share
# ids, hence JAX coordinator ports, and abort each other's jobs: "unexpectedly tried to connect with a different
# incarnation"). Not --dist loadgroup: pytest-xdist 3.8 marks a group by rewriting `item._nodeid`, which pytest 9
# no longer reads (seen 2026-12-02: no grouping at all).
# The longest files go first (longest-processing-time-first scheduling), so no long one starts last and leaves one
# worker idle at the end: pytest-xdist takes the files in collection order once its own reordering (files with the
# most tests first, the default of --dist loadfile since xdist 3.6) is off, which pytest_configure does below. With it
# on, this order was ignored: in a cold run of the pre-wave tests (2026-12-06) the pod-storage file started at 577 s
# and the demo at 825 s, and the run took 1,045 s. Ordered by each file's wall time in that run and in the last whole
# suite (2 cores, three workers, the larger of the two, seconds: pod storage 445, SLURM 277, resume 229, demo 184,
# trainer 178, multi-process 166, BiT training 113, checkpoint failures 95, DINO multi-process 81, ...), down to
# ~30 s; the rest follow in collection order.
LONGEST_FIRST = (
    "tests/storage/test_pod_storage.py", "tests/launch/test_slurm_cluster.py", "tests/train/test_resume.py",
    "tests/test_demo.py", "tests/train/test_trainer.py", "tests/launch/test_multiprocess_training.py",
    "tests/train/test_bit_training.py", "tests/checkpoints/test_checkpoint_failures.py",
    "tests/launch/test_multiprocess_dino.py", "tests/checkpoints/test_interop.py", "tests/models/test_vit.py",
    "tests/train/test_image_text_tfds.py", "tests/train/test_step.py", "tests/models/test_windowed.py",
    "tests/train/test_mpp_training.py", "tests/bench/test_aot_plan.py", "tests/checkpoints/test_siglip_open_clip.py",
    "tests/bench/test_bench_steps.py", "tests/train/test_stages.py", "tests/train/test_swin_segmentation_training.py",
    "tests/train/test_vjepa.py", "tests/bench/test_plan_memory.py", "tests/bench/test_gpu_check.py",
    "tests/models/test_mae.py", "tests/train/test_dino_training.py", "tests/train/test_image_text_training.py",
    "tests/models/test_attention_impl.py", "tests/train/test_segmentation_training.py", "tests/launch/test_tpu_vm.py",
    "tests/train/test_swin_training.py", "tests/models/test_video.py", "tests/train/test_mae_training.py",
    "tests/bench/test_compare.py", "tests/commands/test_bad_inputs.py", "tests/train/test_distillation.py",
    "tests/data/test_cutmix.py", "tests/train/test_parallel_equivalence.py", "tests/models/test_dino.py",
    "tests/bench/test_plan_objectives.py", "tests/models/test_segmentation.py",
)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist present: keep LONGEST_FIRST's order
        config.option.loadscopereorder = False


def pytest_addoption(parser):
    parser.addoption("--ids-from", metavar="FILE", help="run only the tests whose node ids FILE lists, one per line "
                     "(tests/prewave_ids.txt: the suite as it was before this wave, for its time budget)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("ids_from"):
        wanted = set(Path(config.getoption("ids_from")).read_text().splitlines())
        missing = wanted - {item.nodeid for item in items}
        if missing:
            raise pytest.UsageError(f"--ids-from: {len(missing)} listed tests do not exist, e.g. {min(missing)}")
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
        items[:] = [item for item in items if item.nodeid in wanted]
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.fspath).relative_to(ROOT).as_posix(), len(rank)))
