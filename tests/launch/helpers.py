"""Helpers of the launcher tests: the fast trainer arguments, metrics readers, and `Job`, a subprocess whose output is
read in the background so a test can wait for a line, signal the job, and always clean up."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
LOCAL_LAUNCHER = ROOT / "launch" / "local.py"
# Long enough that a signal sent at step 3 to 6 lands well before the end. Every multi-process training test trains
# this many steps: the learning-rate schedule is compiled in, so one length means one compilation, cached for all.
STEPS = 40
# The XLA flags of the test processes (tests/conftest.py sets them in the test session's environment; job_env passes
# them on). The suite compiles hundreds of small programs and runs most for a few steps: XLA:CPU's LLVM at -O0
# compiled the demo's train step in 2.3-2.4 s against 3.9-4.1 s at the default -O2 (2026-12-06, Intel Xeon @ 2.80GHz,
# quiet), and the cold suite took 1,447 s instead of 1,708 s. XLA:CPU's older (non-MLIR) fusion emitters then
# compile the tiny 40-step trainer's train step in 1.5 s of CPU against 4.0 s (a cold tiny run 11.5 vs 15.2 s of CPU,
# warm runs no slower; test_trainer.py + test_step.py cold 111 vs 153 s of CPU; 2026-12-06 evening, same CPU). Runs
# of hundreds of steps (the full demos, the bucket runs) execute slower at -O0 (the demo 309 s vs 205 s in those two
# suites) and get job_env(xla_flags=""): XLA's defaults, as users' runs have them.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def cache_dir() -> str:
    """The compilation cache of the test run (tests/conftest.py sets it: the checkout's, or VIT_JAX_TEST_CACHE_DIR)."""
    return os.environ.get("VIT_JAX_CACHE_DIR") or str(ROOT / ".cache" / "xla")


def job_env(xla_flags: str = TEST_XLA_FLAGS) -> dict[str, str]:
    """The environment of every process the tests start: CPU only, the shared compilation cache, `xla_flags` (none of
    the caller's), no cluster."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("XLA_FLAGS", "VIT_JAX_DISTRIBUTED", "TPU_WORKER_HOSTNAMES")}
    env.update(PYTHONPATH=str(ROOT), VIT_JAX_CACHE_DIR=cache_dir(), JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags,
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    return env


def train_args(workdir: Path, data_dir: str, total_steps: int) -> list[str]:
    """A tiny ViT on digits: global batch 32, every step logged, a checkpoint every 5 steps."""
    return [f"--config={ROOT / 'configs' / 'demo.py'}", f"--workdir={workdir}", f"--config.data.data_dir={data_dir}",
            "--config.total_epochs=0", f"--config.total_steps={total_steps}", "--config.batch_size=32",
            "--config.log_every_steps=1", "--config.eval.every_epochs=0", "--config.eval.fewshot.datasets=()",
            "--config.checkpoint.every_epochs=0", "--config.checkpoint.every_steps=5",
            "--config.model.width=32", "--config.model.depth=1", "--config.model.mlp_dim=64",
            "--config.model.num_heads=2"]


def trainer(*args: str) -> list[str]:
    return [sys.executable, "-m", "vit_jax.main", *args]


def local_launch(num_processes: int, cpu_devices: int, command: list[str], grace_s: float = 120) -> list[str]:
    return [sys.executable, str(LOCAL_LAUNCHER), "-n", str(num_processes), "--cpu-devices", str(cpu_devices),
            "--grace", str(grace_s), "--", *command]


def two_process(workdir: Path, data_dir: str, program: list[str] | None = None,
                extra: tuple[str, ...] = ()) -> list[str]:
    """The local launcher running `program` (default: the trainer) as 2 processes x 2 CPU devices for STEPS steps."""
    return local_launch(2, 2, (program or trainer()) + train_args(workdir, data_dir, STEPS) + list(extra))


def one_and_two_processes(root: Path, data_dir: str, steps: int, extra: tuple[str, ...] = ()) -> dict[str, Path]:
    """The same training run as 1 process x 4 devices and as 2 processes x 2 devices (global batch 32 both), run to
    the end at once (start-up is mostly single-threaded imports, so two jobs overlap well even on 2 cores): the
    workdirs {"one", "two"} under `root`."""
    jobs = [Job(trainer(*train_args(root / "one", data_dir, steps), *extra, "--config.num_cpu_devices=4")),
            Job(local_launch(2, 2, trainer(*train_args(root / "two", data_dir, steps), *extra)))]
    try:
        for job in jobs:
            assert job.finish() == 0, job.tail()
    finally:
        for job in jobs:
            job.kill()
    return {"one": root / "one", "two": root / "two"}


def losses(workdir: Path) -> dict[int, float]:
    """step -> train/loss from metrics.jsonl (a resumed run appends; the later line wins)."""
    out = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "train/loss" in row:
            out[int(row["step"])] = float(row["train/loss"])
    return out


def complete_checkpoints(workdir: Path) -> list[int]:
    """Steps with a finished checkpoint (Orbax renames `N.orbax-checkpoint-tmp*` to `N` only once complete)."""
    d = workdir / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


class Job:
    """One subprocess (a launcher or a single trainer) with its merged output collected line by line."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None):
        self.command = command
        self.proc = subprocess.Popen(command, env=env or job_env(), cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def tail(self, n: int = 60) -> str:
        with self._cond:
            return "\n".join(line[:400] for line in self.lines[-n:] if "I0000" not in line)

    def wait_for(self, pattern: str, timeout: float = 300.0, accept=lambda m: True) -> re.Match:
        """The first output line matching `pattern` (and `accept`), waiting for it; fails if the job ends or hangs
        first."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if (m := rx.search(line)) and accept(m):
                        return m
                seen = len(self.lines)
                ended = self.proc.poll() is not None and not self._reader.is_alive()
                if ended or time.monotonic() > deadline:
                    why = "the job ended" if ended else f"nothing matched for {timeout:.0f}s"
                    raise AssertionError(f"{why} before a line matching {pattern!r}; output tail:\n{self.tail()}")
                self._cond.wait(timeout=1.0)

    def wait_for_step(self, step: int, timeout: float = 300.0) -> re.Match:
        """Process 0's first logged step at or past `step` (the launcher prefixes its lines with [0])."""
        return self.wait_for(r"^\[0\] step (\d+)/", timeout, accept=lambda m: int(m.group(1)) >= step)

    def finish(self, timeout: float = 300.0) -> int:
        """Waits for the job to end (a hang fails the test with the output) and returns its exit status."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job still running after {timeout:.0f}s; output tail:\n{self.tail()}") from None
        self._reader.join(timeout=10)
        return code

    def child_pids(self) -> dict[int, int]:
        """process id -> OS pid, from the local launcher's 'started process I (pid P)' lines."""
        return {int(m.group(1)): int(m.group(2))
                for m in re.finditer(r"\[local\] started process (\d+) \(pid (\d+)\)", self.output)}

    def kill(self) -> None:
        """SIGKILL to the job and to every process it started (each runs in a session of its own)."""
        for pid in [self.proc.pid, *self.child_pids().values()]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
