"""Failing well with checkpoints: a damaged newest step is skipped (and kept, moved aside) on resume; a run whose steps
are all damaged and a save that hits a full disk each end in one line with a documented exit code."""

from __future__ import annotations

import contextlib
import re
import resource
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.train.helpers import ROOT, demo_config, env, run, train_command
from vit_jax.checkpoints.training import (DAMAGED_SUFFIX, SAVE_FAILED_EXIT_CODE, CheckpointError,
                                          load_params_from_run, step_problem)
from vit_jax.train.trainer import Trainer


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, digits_data_dir):
    """A finished 12-step run with checkpoints at steps 4, 8 and 12."""
    workdir = tmp_path_factory.mktemp("saved")
    c = demo_config(digits_data_dir, **{"checkpoint.every_steps": 4, "checkpoint.keep": 5})
    Trainer(c, str(workdir)).train()
    return workdir, c


def _copy(saved_run, tmp_path) -> Path:
    workdir = tmp_path / "run"
    shutil.copytree(saved_run[0], workdir)
    return workdir


def _truncate_largest_state_file(step_dir: Path) -> None:
    largest = max((p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)),
                  key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[:16])


DAMAGE = {
    "truncated array file": _truncate_largest_state_file,
    "missing _METADATA": lambda d: (d / "state" / "_METADATA").unlink(),
    "missing commit marker": lambda d: (d / "commit_success.txt").unlink(),
    "missing data item": lambda d: shutil.rmtree(d / "data"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_resume_walks_back_past_a_damaged_newest_step_and_keeps_it(saved_run, tmp_path, kind, capsys):
    workdir = _copy(saved_run, tmp_path)
    DAMAGE[kind](workdir / "checkpoints" / "12")
    resumed = Trainer(saved_run[1], str(workdir))
    assert resumed.start_step == 8 == int(resumed.state["step"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("skipping checkpoint")]
    assert len(lines) == 1 and lines[0].startswith("skipping checkpoint step 12: "), out
    assert "resumed from" in out and "(step 8)" in out
    resumed.ckpt.close()
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["12", "4", "8"]  # nothing deleted


def test_after_skipping_a_damaged_step_the_run_saves_that_step_again_and_ends_equal(saved_run, tmp_path):
    workdir = _copy(saved_run, tmp_path)
    _truncate_largest_state_file(workdir / "checkpoints" / "12")
    summary = Trainer(saved_run[1], str(workdir)).train()
    assert summary["steps"] == 12
    # The damaged step is kept, moved aside when the run saved that step again.
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == sorted([f"12{DAMAGED_SUFFIX}", "12", "4", "8"])
    assert step_problem(workdir / "checkpoints" / "12") is None
    _, params = load_params_from_run(str(workdir))
    _, reference = load_params_from_run(str(saved_run[0]))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params, reference)


def test_no_restorable_step_is_one_line_and_exit_2(saved_run, tmp_path, digits_data_dir):
    workdir = _copy(saved_run, tmp_path)
    for step in (4, 8, 12):
        (workdir / "checkpoints" / str(step) / "state" / "_METADATA").unlink()
    with pytest.raises(CheckpointError, match="no checkpoint in .* can be restored"):
        Trainer(saved_run[1], str(workdir))
    shutil.rmtree(workdir)
    workdir = _copy(saved_run, tmp_path)
    for step in (4, 8, 12):
        (workdir / "checkpoints" / str(step) / "commit_success.txt").unlink()
    out = run(train_command(workdir, digits_data_dir, "--config.total_steps=12"))
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"vit-jax train: error: no checkpoint in {workdir}/checkpoints can be restored (tried steps "
                      "12, 8, 4; step 4: no commit_success.txt (the save did not finish)); start again in a new "
                      "--workdir, or restore a copy of the checkpoints"], out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["12", "4", "8"]  # nothing renamed


@contextlib.contextmanager
def small_filesystem(path: Path, size_kib: int):
    """A real file system of `size_kib` KiB at `path` (tmpfs; mounting needs root, which CI has)."""
    path.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", f"vitjax{uuid.uuid4().hex[:8]}",
                           str(path)], capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"this test mounts a small tmpfs to fill a real disk and needs root: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_full_disk_stops_the_run_before_the_save_that_cannot_fit_with_one_line_and_exit_74(tmp_path,
                                                                                           digits_data_dir):
    # Checkpoints of the demo model take ~1.7 MiB (2026-12-06): a few fit on 10 MiB, then one does not, well before
    # step 24. 24 steps: the length of test_resume.py's runs, whose train step (the length is compiled into its
    # learning-rate schedule) this run then loads from the compilation cache instead of compiling its own (was: 40
    # steps on 20 MiB, where the disk filled up only at step ~24).
    with small_filesystem(tmp_path / "disk", 10 * 1024) as disk:
        workdir = disk / "run"
        out = run(train_command(workdir, digits_data_dir, "--config.total_steps=24",
                                "--config.checkpoint.every_steps=2", "--config.checkpoint.keep=100"))
        names = sorted((p.name for p in (workdir / "checkpoints").iterdir()), key=lambda n: int(n))
        problems = {name: step_problem(workdir / "checkpoints" / name) for name in names}
    assert out.returncode == SAVE_FAILED_EXIT_CODE, out.stderr[-3000:]
    # Every earlier checkpoint intact, and nothing half-written (only complete step folders).
    assert len(names) >= 2 and names == [str(s) for s in range(2, 2 * len(names) + 1, 2)], names
    assert set(problems.values()) == {None}, problems
    failed = 2 * len(names) + 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(
        f"vit-jax train: error: could not write the checkpoint of step {failed} in {re.escape(str(workdir))}"
        r"/checkpoints: OSError: \[Errno 28\] No space left on device \([\d.]+ MiB free, a checkpoint takes "
        r"[\d.]+ MiB\); free space or lower checkpoint.keep, then rerun to resume", lines[0]), out.stderr[-3000:]
    warning = f"the checkpoint of step {failed - 2} "
    assert warning in out.stdout and "the next one may not fit" in out.stdout  # warned at the save before
    assert not (workdir / "summary.json").exists()


def test_a_save_refused_by_the_os_stops_the_run_with_one_line_and_exit_74(tmp_path, digits_data_dir):
    # A per-file size limit (like a quota) fails Orbax's array write in its background thread: the run stops at
    # that save, naming the OS error, and removes the half-written temporary folder.
    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer instead of failing write()
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 * 2**20, 2 * 2**20))

    workdir = tmp_path / "run"
    # Width 128: a checkpoint's array file outgrows the 2 MiB limit within the first saves (width 64's do not).
    cmd = train_command(workdir, digits_data_dir, "--config.total_steps=8", "--config.checkpoint.every_steps=2",
                        "--config.model.width=128", "--config.model.mlp_dim=256")
    out = subprocess.run(cmd, env={**env(), "VIT_JAX_CACHE_DIR": "none"}, cwd=ROOT, capture_output=True, text=True,
                         timeout=600, preexec_fn=limit_file_size)
    assert out.returncode == SAVE_FAILED_EXIT_CODE, out.stderr[-3000:]
    # Orbax compresses the arrays: which save first outgrows the limit depends on the values (deterministically).
    m = re.fullmatch(f"vit-jax train: error: could not write the checkpoint of step (\\d+) in "
                     f"{re.escape(str(workdir))}/checkpoints: OSError: \\[Errno 27\\] File too large",
                     out.stderr.strip().splitlines()[-1])
    assert m, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "Event loop is closed" not in out.stderr, out.stderr[-3000:]
    names = sorted(p.name for p in (workdir / "checkpoints").iterdir())
    assert names == [str(s) for s in range(2, int(m.group(1)), 2)]  # earlier ones kept, the failed one removed
    assert all(step_problem(workdir / "checkpoints" / n) is None for n in names)


def test_a_failed_saves_folder_is_removed_even_while_its_other_writes_still_add_files(tmp_path):
    # Orbax stops waiting at a save's first failed write; its other writes may still be creating files. Here a
    # writer recreates the temporary folder three times, each time right after it was removed.
    import threading

    from vit_jax.checkpoints.training import RunCheckpointer

    ckpt = RunCheckpointer(str(tmp_path / "checkpoints"), async_save=False)
    partial = tmp_path / "checkpoints" / "4.orbax-checkpoint-tmp"
    (partial / "state").mkdir(parents=True)
    recreated = []

    def writer():
        while len(recreated) < 3:
            if not partial.exists():
                (partial / "meta").mkdir(parents=True)
                (partial / "meta" / "metadata").write_text("{}")
                recreated.append(1)
            threading.Event().wait(0.01)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    ckpt._remove_partial(4)
    thread.join(timeout=60)
    assert len(recreated) == 3 and not thread.is_alive()
    assert not partial.exists() and sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == []
