"""Executing a sweep: every run in turn through a launcher, skipping finished ones, so re-running resumes.

A run whose summary.json says "finished" is skipped. Any other run (never started, interrupted, failed, half-written
summary) is launched with exactly the same command: the trainer itself resumes from the workdir's latest checkpoint.
Each launch is recorded in WORKDIR/sweep_attempts.jsonl (command, exit code, seconds).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from typing import TextIO

from vit_jax.sweep.launchers import Launcher
from vit_jax.sweep.runs import ATTEMPTS, RunState, as_path, read_run, write_manifest
from vit_jax.sweep.spec import Run, Sweep


def workdir_of(root: str, run: Run) -> str:
    # Plain string join keeps gs:// roots intact (pathlib would collapse the '//').
    return f"{str(root).rstrip('/')}/{run.name}"


def _record_attempt(workdir: str, command: list[str], returncode: int, seconds: float) -> None:
    path = as_path(workdir) / ATTEMPTS
    if not path.parent.exists():
        return  # a remote launcher that wrote nothing yet: nothing to annotate
    line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "command": command, "returncode": returncode,
                       "seconds": round(seconds, 1)})
    with path.open("a") as f:
        f.write(line + "\n")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def status_table(states: list[RunState], metric: str = "eval/top1") -> str:
    """A plain-text table: run, status, steps, the metric (in %), exaFLOPs."""
    header = ("run", "status", "steps", metric, "exaFLOPs")
    rows = [header]
    for s in states:
        value = s.metric(metric)
        rows.append((s.name, s.status, _fmt(s.steps, "d"), _fmt(None if value is None else 100 * value, ".2f"),
                     _fmt(s.exaflops, ".3g")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_sweep(sweep: Sweep, root: str, launcher: Launcher, *, only: list[str] | None = None, dry_run: bool = False,
              metric: str = "eval/top1", out: TextIO | None = None) -> int:
    """Runs (or with dry_run prints) every selected run of `sweep` under `root`. Returns 0 when all finished."""
    out = out or sys.stdout
    runs = sweep.select(only)
    n = len(runs)
    commands = {r.name: launcher.command(r.trainer_args(sweep.base, workdir_of(root, r)), workdir_of(root, r))
                for r in sweep.runs}
    if dry_run:
        for i, run in enumerate(runs, 1):
            try:
                state = read_run(workdir_of(root, run), run.name)
                status = state.status + (" (finished: would be skipped)" if state.finished else "")
            except Exception as e:  # noqa: BLE001 - e.g. a gs:// root without network: still print the commands
                status = f"status unknown ({type(e).__name__})"
            print(f"# [{i}/{n}] {run.name}: {status}", file=out)
            print(shlex.join(commands[run.name]), file=out)
        return 0

    write_manifest(root, sweep.source, sweep.base,
                   [{"name": r.name, "overrides": r.all_overrides, "command": commands[r.name]} for r in sweep.runs])
    for i, run in enumerate(runs, 1):
        workdir = workdir_of(root, run)
        state = read_run(workdir, run.name)
        prefix = f"[{i}/{n}] {run.name}"
        if state.finished:
            print(f"{prefix}: finished earlier, skipped", file=out, flush=True)
            continue
        resumed = " (resuming)" if state.status != "pending" else ""
        print(f"{prefix}{resumed} ... ", end="", file=out, flush=True)
        start = time.time()
        returncode = launcher(run.trainer_args(sweep.base, workdir), workdir)
        seconds = time.time() - start
        _record_attempt(workdir, commands[run.name], returncode, seconds)
        if getattr(launcher, "asynchronous", False):
            print(f"submitted, exit code {returncode}", file=out, flush=True)
            continue
        state = read_run(workdir, run.name)
        value = state.metric(metric)
        result = f"{metric} {100 * value:.2f}%" if value is not None else "no metric"
        print(f"{state.status} in {seconds:.0f}s, exit code {returncode}, {result}", file=out, flush=True)

    states = [read_run(workdir_of(root, r), r.name) for r in runs]
    print("\n" + status_table(states, metric), file=out)
    if getattr(launcher, "asynchronous", False):
        print(f"\nruns were submitted as batch jobs; `vit-jax sweep status {sweep.source} --root {root}` follows "
              "them, and re-running this command resubmits only the unfinished ones.", file=out)
        return 0
    unfinished = [s.name for s in states if not s.finished]
    if unfinished:
        print(f"\n{len(unfinished)} of {n} runs did not finish (logs: {root}/RUN/log.txt); re-run the same "
              "command to resume them.", file=out)
        return 1
    return 0
