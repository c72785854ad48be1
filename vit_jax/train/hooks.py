"""Hooks of the trainer: each runs every N steps and once at the end (logging, evaluation, few-shot, checkpoints),
plus the end-of-run summary.json and training-curve plot.

A hook sees the run through a HookContext: read-only facts of this run segment, the current parameters, the one
action it may take (save a checkpoint), and the run's progress record (train time, best metrics: kept across
restarts in every checkpoint), which hooks update. What a hook produces (its latest metrics) stays on the hook,
where the summary reads it. A hook never reaches into the Trainer.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import os
import time
from typing import Any, Callable

import jax
import numpy as np

from vit_jax.eval.classification import evaluate
from vit_jax.eval.fewshot import fewshot_on_datasets
from vit_jax.models.build import family_of
from vit_jax.storage.jsonl import read_jsonl
from vit_jax.train import objectives
from vit_jax.train.metrics import format_duration


class StepTimer:
    """Host time spent waiting for data, and in hooks (eval, checkpoints: excluded from throughput), between logs."""

    def __init__(self):
        self.data_s = 0.0
        self.hooks_s = 0.0

    @contextlib.contextmanager
    def data(self):
        t = time.perf_counter()
        yield
        self.data_s += time.perf_counter() - t

    @contextlib.contextmanager
    def hook(self):
        t = time.perf_counter()
        yield
        self.hooks_s += time.perf_counter() - t

    def reset(self) -> tuple[float, float]:
        out = (self.data_s, self.hooks_s)
        self.data_s = self.hooks_s = 0.0
        return out


@dataclasses.dataclass(frozen=True)
class HookContext:
    """What hooks may read about the run, and do to it."""

    config: Any  # the run's ml_collections config (validated)
    workdir: str
    durations: Any  # train/config.Durations: total steps, eval/checkpoint/few-shot intervals
    start_step: int  # where this segment started (0, or the step resumed from)
    train_examples: int
    dataset: Any  # data/datasets.Dataset
    program: Any  # train/program.Program: model, eval step, shardings, FLOPs per image
    hardware: dict[str, Any]  # device kind and count, peak FLOP/s per device, TPU cores per device
    progress: dict[str, Any]  # {"train_time_s", "wall_time_s", "best"}: saved in checkpoints; hooks update it
    params: Callable[[], Any]  # the current parameters
    save_checkpoint: Callable[..., None]  # (step, data_state, wait=False)
    # What the objective's eval step reads (train/program.py eval_view): the parameters, with any extra state.
    eval_params: Callable[[], Any] | None = None


class Hook(abc.ABC):
    every = 0

    def __init__(self, ctx: HookContext):
        self.ctx = ctx
        self.total = ctx.durations.total_steps

    def maybe_run(self, step: int, metrics: dict, it, timer: StepTimer) -> None:
        if self.every and step % self.every == 0 and step < self.total:
            with timer.hook():
                self.run(step, it)

    @abc.abstractmethod
    def run(self, step: int, it) -> None:
        """The hook's work at `step`."""

    def finish(self, step: int, it) -> None:
        self.run(step, it)

    def state(self) -> dict | None:
        """What the hook must carry over a restart (saved in every checkpoint's metadata), or None."""
        return None

    def restore(self, state: dict) -> None:
        """Takes back what `state()` returned at the checkpoint the run resumes from."""


class LogHook(Hook):
    """Training metrics every `log_every_steps`: loss, lr, norms, skips, img/s, step time, data-wait fraction, MFU,
    cumulative exaFLOPs, device-hours / TPU-core-days, examples seen, epoch; with a bucket workdir or data_dir, the
    transient storage errors retried so far (this process); and a console progress line."""

    def __init__(self, ctx, writer):
        super().__init__(ctx)
        from vit_jax.train import workdir as wd

        self.writer = writer
        self.uses_bucket = not wd.is_local(ctx.workdir) or ctx.dataset.remote
        self.every = ctx.config.log_every_steps
        self.pending: list[dict] = []
        self.t_last: float | None = None
        self.step_last = ctx.start_step
        self.perf: dict[str, float] = {}  # the last throughput figures (img/s, MFU, ...), for the summary

    def maybe_run(self, step, metrics, it, timer):
        self.pending.append(metrics)
        self.timer = timer
        if self.t_last is None:  # the first step includes compilation: start the throughput clock after it
            jax.block_until_ready(metrics)
            self.t_last, self.step_last = time.perf_counter(), step
            timer.reset()
        if (self.every and step % self.every == 0) or step == self.total:
            self.run(step, it)

    def run(self, step, it):
        if not self.pending or "lr" not in self.pending[-1]:  # nothing trained since the last log (or the restart)
            return
        ctx = self.ctx
        fetched = jax.device_get(self.pending)
        self.pending = []
        scalars = {
            "train/loss": float(np.mean([m["loss"] for m in fetched])),
            "train/lr": float(fetched[-1]["lr"]),
            "train/grad_norm": float(np.mean([m["grad_norm"] for m in fetched])),
            "train/param_norm": float(fetched[-1]["param_norm"]),
            "train/skipped_steps": int(fetched[-1]["skipped"]),
        }
        b = ctx.config.batch_size
        scalars.update(progress_scalars(ctx, step))
        if self.uses_bucket:
            from vit_jax.storage import remote

            scalars["storage/retries"] = remote.retries()
        now = time.perf_counter()
        wall, steps = now - self.t_last, step - self.step_last
        line = f"step {step}/{self.total} ({100 * step / self.total:.0f}%)"
        if steps > 0 and wall > 0:  # throughput needs a timed interval (not the compile step alone)
            ctx.progress["train_time_s"] += wall
            self.t_last, self.step_last = now, step
            data_s, hooks_s = self.timer.reset()
            wall = max(wall - hooks_s, 1e-9)  # evaluation and checkpoint time are not training throughput
            hw = ctx.hardware
            img_s = steps * b / wall
            device_hours = ctx.progress["train_time_s"] * hw["num_devices"] / 3600
            scalars.update({
                "perf/img_per_sec": img_s,
                "perf/step_time_s": wall / steps,
                "perf/data_wait_fraction": data_s / wall,
                "perf/mfu": img_s * ctx.program.flops_per_image / (hw["peak_flops_per_device"] * hw["num_devices"]),
                "compute/device_hours": device_hours,
            })
            if hw["tpu_cores_per_device"]:
                scalars["compute/tpu_core_days"] = device_hours * hw["tpu_cores_per_device"] / 24
            self.perf = scalars
            line += (f" | ETA {format_duration((self.total - step) * wall / steps)} | {img_s:,.0f} img/s | "
                     f"MFU {100 * scalars['perf/mfu']:.1f}%")
        self.writer.write(step, scalars)
        _print(f"{line} | loss {scalars['train/loss']:.4f} | lr {scalars['train/lr']:.2e}")

    def finish(self, step, it):
        self.run(step, it)

    # The steps of the logging window not yet logged: a run resumed mid-window logs the same averages as one that
    # was never interrupted.
    def state(self):
        fetched = jax.device_get(self.pending)
        return {"loss": [float(m["loss"]) for m in fetched], "grad_norm": [float(m["grad_norm"]) for m in fetched]}

    def restore(self, state):
        self.pending = [{"loss": np.float32(loss), "grad_norm": np.float32(g)}
                        for loss, g in zip(state.get("loss", []), state.get("grad_norm", []))] + self.pending


# Evaluators a config names in eval.evaluators: name -> a Hook class constructed as cls(ctx, writer). Generic
# evaluators (few-shot) register here with @evaluator("name"); each objective's own evaluator is its `evaluator` name
# (train/objectives/), run by ObjectiveEvalHook.
EVALUATORS: dict[str, type[Hook]] = {}


def evaluator(name: str):
    def register(cls: type[Hook]) -> type[Hook]:
        assert name not in EVALUATORS, f"evaluator {name} registered twice"
        EVALUATORS[name] = cls
        return cls

    return register


def known_evaluators() -> list[str]:
    return sorted({*EVALUATORS, *objectives.evaluator_objectives()})


def check_evaluators(names) -> None:
    """Unknown names in eval.evaluators: one line with the known ones (before any data is read or code compiled)."""
    from vit_jax.train.config import ConfigError

    unknown = [n for n in names if n not in known_evaluators()]
    if unknown:
        raise ConfigError(f"eval.evaluators: unknown evaluator(s) {', '.join(map(repr, unknown))}; known: "
                          f"{', '.join(known_evaluators())}")
    if len(set(names)) != len(names):
        raise ConfigError(f"eval.evaluators lists an evaluator twice: {tuple(names)}")


class ObjectiveEvalHook(Hook):
    """The run's objective's own evaluation on data.eval_split (every eval interval and at the end): what its
    `report` says (metrics, the best by its ranking metric, one printed line)."""

    def __init__(self, ctx, writer):
        super().__init__(ctx)
        self.writer = writer
        self.every = ctx.durations.eval_every
        self.last_step = None
        self.latest: dict[str, float] = {}

    def run(self, step, it):
        objective = self.ctx.program.objective
        report = objective.report(run_eval(self.ctx, objective.evaluate), self.ctx.config)
        self.last_step = step
        self.latest = dict(report.metrics)
        keep_best(self.ctx, step, report.best, self.latest[report.best], higher_is_better=report.higher_is_better)
        self.writer.write(step, {**self.latest, **progress_scalars(self.ctx, step)})
        _print(f"eval step {step}: {report.line}")

    def finish(self, step, it):
        if self.last_step != step:
            self.run(step, it)


def keep_best(ctx: HookContext, step: int, key: str, value: float, *, higher_is_better: bool) -> None:
    """Records `value` (and `step`) as the run's best when it is at least as good as the best so far."""
    best = ctx.progress["best"]
    if key not in best or (value >= best[key] if higher_is_better else value <= best[key]):
        best.update({key: value, "step": step})


@evaluator("fewshot")
class FewShotHook(Hook):
    def __init__(self, ctx, writer):
        super().__init__(ctx)
        self.writer = writer
        fs = ctx.config.eval.fewshot
        self.datasets = tuple(fs.datasets)
        self.every = ctx.durations.fewshot_every if self.datasets else 0
        self.last_step = None
        self.latest: dict[str, float] = {}
        self.features_fn = None  # jitted on first use

    def run(self, step, it):
        if not self.datasets:
            return
        if self.features_fn is None:
            self.features_fn = features_function(self.ctx.program)
        self.latest = run_fewshot(self.ctx, self.features_fn)
        self.last_step = step
        self.writer.write(step, {**self.latest, **progress_scalars(self.ctx, step)})
        _print(f"few-shot step {step}: " + ", ".join(f"{k.split('/', 1)[1]} {100 * v:.1f}%"
                                                     for k, v in self.latest.items()))

    def finish(self, step, it):
        if self.datasets and self.last_step != step:
            self.run(step, it)


class CheckpointHook(Hook):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.every = ctx.durations.checkpoint_every

    def run(self, step, it):
        self.ctx.save_checkpoint(step, it.get_state())

    def finish(self, step, it):
        self.ctx.save_checkpoint(step, it.get_state(), wait=True)  # a no-op if `step` is saved already


def finish_all(hooks: list[Hook], step: int, it) -> None:
    """Every hook's end-of-run work, in order, even after one fails (then its error is raised at the end): a
    failing final evaluation (say, a few-shot dataset missing) must not cost the final checkpoint, so the rerun
    resumes at the end and only repeats the evaluations."""
    error = None
    for hook in hooks:
        try:
            hook.finish(step, it)
        except Exception as e:  # noqa: BLE001 - re-raised below, once the remaining hooks have run
            error = error or e
    if error is not None:
        raise error


def progress_scalars(ctx: HookContext, step: int) -> dict[str, float]:
    """Where training stands at `step`: on every metrics line, so curves can use any progress axis."""
    examples = step * ctx.config.batch_size
    return {"progress/examples_seen": examples, "progress/epoch": examples / ctx.train_examples,
            "compute/exaflops": examples * ctx.program.flops_per_image / 1e18}


def default_hooks(ctx: HookContext, writer) -> list[Hook]:
    # Order matters at a shared step: log, then evaluate, then checkpoint (so the checkpoint records best metrics).
    names = tuple(ctx.config.eval.evaluators)
    check_evaluators(names)
    own = objectives.objective_class(ctx.config.objective).evaluator
    return [LogHook(ctx, writer), *((ObjectiveEvalHook if name == own else EVALUATORS[name])(ctx, writer)
                                     for name in names), CheckpointHook(ctx)]


def _print(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


# ---------------------------------------------------------------------------------------------------------------------
def run_eval(ctx: HookContext, evaluate_fn: Callable = evaluate) -> dict[str, float]:
    """`evaluate_fn(eval_step, params, batches)` (eval/classification.py's sums by default) on data.eval_split, with
    the objective's eval view of the state (its parameters, and any extra state)."""
    from vit_jax.data import pipeline

    c = ctx.config
    batches = pipeline.eval_iterator(ctx.dataset, split=c.data.eval_split, pp=c.data.pp_eval,
                                     global_batch_size=c.eval.batch_size or c.batch_size,
                                     sharding=ctx.program.batch_sh)
    with batches:
        return evaluate_fn(ctx.program.eval_step, (ctx.eval_params or ctx.params)(), batches)


def features_function(program) -> Callable:
    """The jitted pre-logits features of the program's model, sharded as its eval step."""
    from vit_jax.eval.steps import features_step
    from vit_jax.parallel.distributed import SyncedJit

    return SyncedJit(jax.jit(features_step(program.model), in_shardings=(program.param_sh, program.batch_sh)),
                     "features")


def run_fewshot(ctx: HookContext, features_fn: Callable) -> dict[str, float]:
    c = ctx.config
    fs = c.eval.fewshot
    return fewshot_on_datasets(
        features_fn, ctx.params(), fs.datasets, data_dir=c.data.data_dir or None,
        pp=c.data.pp_eval, batch_size=c.eval.batch_size or c.batch_size, sharding=ctx.program.batch_sh,
        train_split=fs.train_split, test_split=fs.test_split, shots=fs.shots, l2_reg=fs.l2_reg, seeds=fs.seeds,
        max_test_examples=fs.max_test_examples, max_train_examples=fs.max_train_examples, knn=tuple(fs.knn),
        knn_temperature=fs.knn_temperature)


# ---------------------------------------------------------------------------------------------------------------------
def write_summary(ctx: HookContext, step: int, hooks: list[Hook], *, skipped_steps: int, wall_time_s: float,
                  compile_time_s: float | None) -> dict[str, Any]:
    c = ctx.config
    final: dict[str, float] = {}
    for hook in hooks:
        final.update(getattr(hook, "latest", {}))
    perf = next((h.perf for h in hooks if isinstance(h, LogHook)), {})
    hw = ctx.hardware
    device_hours = ctx.progress["train_time_s"] * hw["num_devices"] / 3600
    examples = step * c.batch_size
    m = ctx.program.model_cfg
    flops = ctx.program.flops_per_image
    summary = {
        "status": "finished",
        "name": os.path.basename(ctx.workdir.rstrip("/")),
        "workdir": ctx.workdir,
        "model": {"name": m.name, "variant": c.model.variant, "params": ctx.program.model.num_params(),
                  "image_size": list(m.image_size),
                  "patch_size": list(m.patch_size) if hasattr(m, "patch_size") else None,
                  "family": family_of(m).label(m),  # the paper's three: ViT, Hybrid, ResNet
                  "attention": ctx.program.attention},  # kernel requested / used / why (models/attention_impl.py)
        "dataset": {"name": c.data.name, "train_examples": ctx.train_examples},
        "global_batch_size": c.batch_size,
        "steps": step,
        "epochs": examples / ctx.train_examples,
        "examples_seen": examples,
        "compute": {
            "train_flops_per_image": flops,
            "exaflops": examples * flops / 1e18,
            "device_hours": device_hours,
            "device_days": device_hours / 24,
            "tpu_v3_core_days": (device_hours * hw["tpu_cores_per_device"] / 24
                                 if "v3" in hw["device_kind"].lower() else None),
            "tpu_core_days": (device_hours * hw["tpu_cores_per_device"] / 24 if hw["tpu_cores_per_device"] else None),
            "device_kind": hw["device_kind"],
            "num_devices": hw["num_devices"],
            "img_per_sec": perf.get("perf/img_per_sec"),
            "mfu": perf.get("perf/mfu"),
            "compile_time_s": compile_time_s,
        },
        "final": final,
        "best": dict(ctx.progress["best"]),
        "skipped_steps": skipped_steps,
        "wall_time_s": wall_time_s,  # across restarts (each segment counted to its last checkpoint)
        "config": c.to_dict(),
    }
    if jax.process_index() == 0:
        from vit_jax.train import workdir as wd
        from vit_jax.train.plots import plot_training_curves

        wd.write_bytes(wd.path(ctx.workdir, "summary.json"),
                       json.dumps(summary, indent=2, default=_jsonable).encode())
        png = plot_training_curves(read_jsonl(wd.path(ctx.workdir, "metrics.jsonl")), title=m.name)
        wd.write_bytes(wd.path(ctx.workdir, "curves.png"), png)
    return summary


def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, tuple):
        return list(x)
    return str(x)
