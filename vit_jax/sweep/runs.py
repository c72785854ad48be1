"""Reading what a training run left in its workdir: summary.json, metrics.jsonl and the sweep's attempt log.

Tolerant by design: a run may be pending (no workdir), still running, interrupted, failed or have a half-written
file; each case becomes a status and a list of problems instead of an exception, so reports cover partial sweeps.
Paths may be local or remote (gs://...): remote ones are read through etils.epath.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from vit_jax.storage import remote
from vit_jax.storage.jsonl import read_jsonl

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
ATTEMPTS = "sweep_attempts.jsonl"  # one line per launch by `vit-jax sweep run`: command, exit code, seconds
MANIFEST = "sweep.json"  # in the sweep root: the expanded runs, so reports know which runs are missing

# Training progress in metrics.jsonl: the contract's plain keys, and the namespaced ones the trainer also writes.
PROGRESS_KEYS = {
    "step": ("step",),
    "examples_seen": ("examples_seen", "progress/examples_seen"),
    "epoch": ("epoch", "progress/epoch"),
    "exaflops": ("exaflops", "compute/exaflops"),
}
SUMMARY_PROGRESS = {"step": ("steps",), "examples_seen": ("examples_seen",), "epoch": ("epochs",),
                    "exaflops": ("compute", "exaflops")}
_ACCURACY = re.compile(r"(^fewshot/|(top\d+|prec\d+|acc|accuracy)$)")


def is_accuracy(key: str) -> bool:
    """Accuracy-like metric names (fractions): eval/top1, eval/prec1, fewshot/..., not losses or counts."""
    return bool(_ACCURACY.search(key))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def as_path(path: str | Path):
    """A pathlib.Path for local paths, an etils.epath.Path for URLs such as gs://bucket/dir."""
    if isinstance(path, str) and remote.is_url(path):
        from etils import epath  # orbax's dependency; only needed for remote sweep roots

        return epath.Path(path)
    return Path(path)


@dataclasses.dataclass
class RunState:
    """What is known about one run."""

    name: str
    workdir: Any
    status: str  # finished | running | failed | started | pending | corrupt | <a summary's own status>
    summary: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    attempts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def steps(self) -> int | None:
        if self.summary and self.summary.get("steps") is not None:
            return int(self.summary["steps"])
        steps = [m["step"] for m in self.metrics if isinstance(m.get("step"), (int, float))]
        return int(max(steps)) if steps else None

    @property
    def exaflops(self) -> float | None:
        value = _number(nested_get(self.summary, "compute", "exaflops"))
        if value is None:  # unfinished run: the compute spent so far
            values = [x for _, x in self.progress("exaflops")]
            value = max(values) if values else None
        return value

    def progress(self, key: str) -> list[tuple[float, float]]:
        """(step, value) pairs of a progress measure (a PROGRESS_KEYS name) from metrics.jsonl and the summary."""
        pairs = {}
        for m in self.metrics:
            step = _number(m.get("step"))
            value = next((_number(m.get(k)) for k in PROGRESS_KEYS[key] if _number(m.get(k)) is not None), None)
            if step is not None and value is not None:
                pairs[step] = value
        step, value = _number(nested_get(self.summary, "steps")), _number(nested_get(self.summary, *SUMMARY_PROGRESS[key]))
        if step is not None and value is not None:
            pairs[step] = value
        return sorted(pairs.items())

    def curve(self, metric: str, progress: str = "examples_seen") -> list[tuple[float, float]]:
        """(progress, metric) at every logged value of `metric`.

        Eval lines need not carry the progress keys: progress is linear in the step (fixed batch size), so it is
        interpolated from the lines and summary that do (with step 0 at 0).
        """
        points = [(float(m["step"]), float(m[metric])) for m in self.metrics
                  if _number(m.get("step")) is not None and _number(m.get(metric)) is not None]
        if not points:
            return []
        if progress == "step":
            return points
        known = [(0.0, 0.0), *self.progress(progress)]
        if len(known) < 2:
            return []
        xs, ys = zip(*sorted(dict(known).items()))
        # Beyond the last known step, extrapolate with the overall rate rather than clamping.
        rate = ys[-1] / xs[-1] if xs[-1] else 0.0
        return [(float(np.interp(s, xs, ys)) if s <= xs[-1] else s * rate, v) for s, v in points]

    def metric(self, key: str) -> float | None:
        """The run's final value of `key` (summary), else its latest logged value (metrics.jsonl)."""
        value = _number(nested_get(self.summary, "final", key))
        if value is None:
            logged = [_number(m.get(key)) for m in self.metrics if _number(m.get(key)) is not None]
            value = logged[-1] if logged else None
        return value


def nested_get(tree: dict | None, *keys: str) -> Any:
    """tree[k1][k2]... or None where a level is missing (summaries written by older versions lack some keys)."""
    for key in keys:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def read_run(workdir, name: str | None = None) -> RunState:
    """The state of the run in `workdir` (which need not exist)."""
    workdir = as_path(workdir)
    state = RunState(name=name or workdir.name, workdir=workdir, status="pending")
    if not workdir.exists():
        return state
    state.status = "started"
    if (workdir / METRICS).exists():
        state.metrics = read_jsonl(workdir / METRICS, state.problems)
    if (workdir / ATTEMPTS).exists():
        state.attempts = read_jsonl(workdir / ATTEMPTS, state.problems)
    if (workdir / SUMMARY).exists():
        try:
            summary = json.loads((workdir / SUMMARY).read_text())
        except json.JSONDecodeError:
            state.status = "corrupt"
            state.problems.append(f"{SUMMARY} is not valid JSON (the run will be re-run)")
            return state
        if not isinstance(summary, dict):
            state.status = "corrupt"
            state.problems.append(f"{SUMMARY} is not a JSON object")
            return state
        state.summary = summary
        state.status = str(summary.get("status", "finished"))
    if not state.finished and state.attempts and state.attempts[-1].get("returncode") not in (0, None):
        # The trainer exited with an error after the last launch: more telling than 'running'.
        state.status = "failed"
        state.problems.append(f"last launch exited with code {state.attempts[-1]['returncode']} "
                              f"(see {workdir / 'log.txt'})")
    return state


def write_manifest(root, source: str, base: str, runs: list[dict[str, Any]]) -> None:
    """Records the expanded sweep in ROOT/sweep.json (for reports and for people)."""
    root = as_path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).write_text(json.dumps({"sweep": source, "base": base, "runs": runs}, indent=2) + "\n")


def stage_runs(state: RunState) -> list[RunState]:
    """The stages of a multi-stage run (train/stages.py: summary.json lists them), each a run of its own named
    RUN/STAGE; [state] itself for any other run."""
    stages = nested_get(state.summary, "stages")
    if not isinstance(stages, dict) or not stages:
        return [state]
    return [read_run(state.workdir / stage, f"{state.name}/{stage}") for stage in stages]


def read_sweep_root(root) -> tuple[list[RunState], list[str]]:
    """Every run under a sweep root: those in its manifest (also when never started) and any other directory with a
    summary.json or metrics.jsonl; a multi-stage run counts as its stages. The root may itself be a multi-stage run
    (`vit-jax sweep report WORKDIR` of configs/demo_ssl.py). Returns the runs (manifest order, then by name) and
    problems found."""
    root = as_path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"sweep root {root} does not exist; run `vit-jax sweep run CONFIG --root {root}` first")
    itself = read_run(root, root.name)
    if nested_get(itself.summary, "stages"):
        return stage_runs(itself), []
    problems: list[str] = []
    names: list[str] = []
    if (root / MANIFEST).exists():
        try:
            names = [r["name"] for r in json.loads((root / MANIFEST).read_text())["runs"]]
        except (json.JSONDecodeError, KeyError, TypeError):
            problems.append(f"{root / MANIFEST} is unreadable; listing run directories only")
    others = sorted(p.name for p in root.iterdir()
                    if p.is_dir() and p.name not in names and ((p / SUMMARY).exists() or (p / METRICS).exists()))
    return [stage for name in names + others for stage in stage_runs(read_run(root / name, name))], problems
