"""Launchers: how one training run of a sweep is started.

A launcher is a callable `launcher(trainer_args, workdir) -> exit code` that runs `python -m vit_jax.main
*trainer_args` somewhere and blocks until the run ends; `launcher.command(trainer_args, workdir)` is the command line
it would execute (what `--dry-run` prints).

- local: a subprocess on this machine, output appended to WORKDIR/log.txt.
- tpu / slurm: hand the run to the repository's launch scripts (docs/launching.md); extra flags from
  `--launcher-arg` (the pod's `--name`, `--zone`, `--accelerator-type`; the SLURM `--nodes`, `--partition`, ...) go
  before the `--`:

      python launch/tpu_vm.py launch --workdir=WORKDIR [--preflight] [LAUNCHER_ARGS...] -- TRAINER_ARGS...
      python launch/slurm.py --workdir=WORKDIR --job-name=RUN [LAUNCHER_ARGS...] -- TRAINER_ARGS...

  where TRAINER_ARGS are the arguments of `python -m vit_jax.main` without `--workdir` (the launchers set it). The
  TPU launcher runs the trainer on every worker of the pod and blocks until it ends (runs go one after another on
  the pod; with `--preflight` each run is first compiled for the pod's topology and not started if it does not
  fit); the SLURM launcher submits a batch job and returns, so all runs of a sweep queue at once and
  `vit-jax sweep status` follows them.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol, Sequence

from vit_jax.sweep.runs import as_path
from vit_jax.sweep.spec import REPO_ROOT

TRAINER_ENV = "VIT_JAX_SWEEP_TRAINER"  # e.g. "python tests/sweep/fake_trainer.py" in tests
LAUNCH_SCRIPTS = {"tpu": "launch/tpu_vm.py", "slurm": "launch/slurm.py"}
LAUNCHERS = ("local", *LAUNCH_SCRIPTS)


class Launcher(Protocol):
    """Runs one training run and returns its exit code."""

    def command(self, trainer_args: Sequence[str], workdir: str) -> list[str]: ...

    def __call__(self, trainer_args: Sequence[str], workdir: str) -> int: ...


def trainer_command(trainer: str | None = None) -> list[str]:
    """The command that trains: `trainer` if given, else $VIT_JAX_SWEEP_TRAINER, else this Python's vit_jax.main."""
    trainer = trainer or os.environ.get(TRAINER_ENV)
    return shlex.split(trainer) if trainer else [sys.executable, "-m", "vit_jax.main"]


def _wait(proc: subprocess.Popen) -> int:
    """Waits for the trainer. On Ctrl-C it got the same SIGINT (same process group) and saves a checkpoint before
    exiting, so wait for that (subprocess.run would kill it after 0.25 s); a second Ctrl-C kills it."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            proc.wait()
        raise


class LocalLauncher:
    """Runs the trainer as a subprocess of this process, one run at a time."""

    def __init__(self, trainer: list[str]):
        self.trainer = list(trainer)

    def command(self, trainer_args: Sequence[str], workdir: str) -> list[str]:
        return [*self.trainer, *trainer_args]

    def __call__(self, trainer_args: Sequence[str], workdir: str) -> int:
        cmd = self.command(trainer_args, workdir)
        log_dir = Path(workdir)
        log_dir.mkdir(parents=True, exist_ok=True)
        # Append: a resumed run keeps the log of its earlier attempts above the new one.
        with open(log_dir / "log.txt", "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            return _wait(proc)


class ScriptLauncher:
    """Hands each run to a launch/ script (TPU VM pods, SLURM) with the command line in the module docstring."""

    def __init__(self, kind: str, extra_args: Sequence[str] = (), python: str = sys.executable,
                 preflight: bool = False):
        self.kind = kind
        self.script = REPO_ROOT / LAUNCH_SCRIPTS[kind]
        self.extra_args = list(extra_args)
        self.python = python
        self.preflight = preflight  # tpu: compile each run for the pod's topology first (launch/tpu_vm.py)

    @property
    def asynchronous(self) -> bool:
        """True when the command only submits the run (SLURM): it ends before the training does."""
        return self.kind == "slurm"

    def command(self, trainer_args: Sequence[str], workdir: str) -> list[str]:
        args = [a for a in trainer_args if not a.startswith("--workdir=")]
        if self.kind == "tpu":
            head = ["launch", f"--workdir={workdir}", *(["--preflight"] if self.preflight else [])]
        else:
            head = [f"--workdir={workdir}", f"--job-name={as_path(workdir).name}"]
        return [self.python, str(self.script), *head, *self.extra_args, "--", *args]

    def __call__(self, trainer_args: Sequence[str], workdir: str) -> int:
        if not self.script.is_file():
            raise FileNotFoundError(f"{self.script} is missing: --launcher={self.kind} needs the launch/ scripts of "
                                    "the repository checkout (see docs/sweeps.md), or use --launcher=local")
        return _wait(subprocess.Popen(self.command(trainer_args, workdir), stdin=subprocess.DEVNULL))


def make_launcher(kind: str, *, trainer: str | None = None, extra_args: Sequence[str] = (),
                  preflight: bool = False) -> Launcher:
    """The launcher called `kind` (one of LAUNCHERS); `preflight` (tpu only) compiles each run for the pod first."""
    if preflight and kind != "tpu":
        raise ValueError("--preflight applies to --launcher=tpu (it compiles each run for the pod's TPU topology)")
    if kind == "local":
        if extra_args:
            raise ValueError("--launcher-arg only applies to --launcher=tpu|slurm")
        return LocalLauncher(trainer_command(trainer))
    if kind in LAUNCH_SCRIPTS:
        return ScriptLauncher(kind, extra_args, preflight=preflight)
    raise ValueError(f"unknown launcher {kind!r}; choose one of {', '.join(LAUNCHERS)}")
