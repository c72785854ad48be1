"""The one trainer: pretraining, fine-tuning and evaluation share this set-up and loop; behaviour differs by config
and by the hooks that run at their step intervals (logging, evaluation, few-shot, checkpoints).

Set-up order matters for multi-host runs: the dataset is prepared by process 0 first; the state is initialised by a
jitted function directly into its target shardings (no host copy of a large model), or restored from the latest
complete checkpoint in the workdir (auto-resume), or built from a pretrained checkpoint (fine-tuning).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import jax
import ml_collections

from vit_jax import __version__
from vit_jax.checkpoints.training import RunCheckpointer, git_commit, model_meta
from vit_jax.data import pp as pp_lib
from vit_jax.errors import DIVERGED_EXIT_CODE, UserError
from vit_jax.models.build import family_of
from vit_jax.parallel.distributed import barrier
from vit_jax.train import config as config_lib
from vit_jax.train import hooks as hooks_lib
from vit_jax.train import objectives
from vit_jax.train import workdir as wd
from vit_jax.train.metrics import TPU_CORES, MetricWriter, device_peak_flops, table_lookup
from vit_jax.train.ema import weights
from vit_jax.train.program import build_program


class NonFiniteError(UserError, RuntimeError):
    """Too many consecutive skipped (non-finite) steps: training diverged; the last good state is saved."""

    exit_code = DIVERGED_EXIT_CODE


def log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


class Trainer:
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        config_lib.validate(config)
        if config.stages:
            raise config_lib.ConfigError("this config has stages: run it with `python -m vit_jax.main` (each stage "
                                         "trains in WORKDIR/<stage>; train/stages.py), not with one Trainer")
        hooks_lib.check_evaluators(tuple(config.eval.evaluators))
        self.config = config
        self.workdir = workdir = wd.resolve(workdir)  # Orbax needs absolute paths; buckets stay as they are
        self.is_main = jax.process_index() == 0
        wd.check(workdir)  # a missing bucket: one line, before any work
        if self.is_main:
            wd.path(workdir).mkdir(parents=True, exist_ok=True)
        self.t_start = time.time()
        # Files the objective keeps with the run (a tokenizer): in the workdir from the first start, used from there.
        self.run_files = objectives.objective_class(config.objective).keep_with_run(config, workdir, self.is_main)
        if config.init.checkpoint:  # a wrong path is reported before data preparation and compilation
            from vit_jax.checkpoints.loading import check_exists

            check_exists(config.init.checkpoint)
        self._setup_data()
        self._setup_model_and_optimizer()
        self._setup_state()
        self._preempted = 0  # the signal that asked this process to stop (0: none)

    # -----------------------------------------------------------------------------------------------------------------
    def _setup_data(self) -> None:
        from vit_jax.data import pipeline
        from jax.experimental import multihost_utils

        c = self.config.data
        kw = dict(data_dir=c.data_dir or None, manual_dir=c.manual_dir or None)
        if jax.process_count() > 1:
            if self.is_main:  # one process prepares (e.g. builds digits), the others then open it
                pipeline.open_dataset(c.name, prepare=True, **kw)
            multihost_utils.sync_global_devices("dataset prepared")
        self.ds = pipeline.open_dataset(c.name, prepare=True, **kw)
        self.train_examples = max(1, int(self.ds.num_examples(c.train_split) * c.fraction))
        self.dur = config_lib.resolve_durations(self.config, self.train_examples)

    def _setup_model_and_optimizer(self) -> None:
        self.program = p = build_program(self.config, self.ds.num_classes, self.dur,
                                         architecture=self._init_architecture())
        # Short names for what the trainer (and tests) read most.
        self.model_cfg, self.model, self.mesh = p.model_cfg, p.model, p.mesh
        self.param_sh, self.batch_sh, self.abstract_state = p.param_sh, p.batch_sh, p.abstract_state
        self.train_step, self.eval_step, self.flops_per_image = p.train_step, p.eval_step, p.flops_per_image

    def _setup_state(self) -> None:
        c = self.config
        ck = c.checkpoint
        self.ckpt = RunCheckpointer(str(wd.path(self.workdir, "checkpoints")), keep=ck.keep,
                                    keep_every=ck.keep_every_steps, async_save=ck.async_save)
        self.progress = {"train_time_s": 0.0, "wall_time_s": 0.0, "best": {}}
        self._hook_states: dict[str, dict] = {}  # what each hook carried over the restart (see Hook.state)
        self._hooks: list = []
        self.data_state: dict | None = None  # the restored iterator state, if resumed
        restored = self.ckpt.restore_latest(self.abstract_state, log=log, check_meta=self._check_same_model)
        if restored is not None:
            latest, self.state, data_state, meta = restored
            self.progress = {**self.progress, **meta.get("progress", {})}
            self._hook_states = meta.get("hooks", {})
            self.start_step = int(data_state["step"])
            self.data_state = data_state
            assert self.start_step == int(self.state["step"]), (self.start_step, int(self.state["step"]))
            log(f"resumed from {self.ckpt.directory}/{latest} (step {self.start_step})")
        else:
            self.state = self._initial_state()
            self.start_step = 0
        self._wall_before = float(self.progress["wall_time_s"])  # earlier segments, up to their last checkpoint

    def _init_architecture(self):
        """The init checkpoint's architecture, for a config whose model.variant is empty (taken from init)."""
        c = self.config
        if c.model.variant or not c.init.checkpoint:
            return None
        if not hasattr(self, "_init_loaded"):
            from vit_jax.checkpoints.loading import load_any

            self._init_loaded = load_any(c.init.checkpoint)
        log(f"architecture from {c.init.checkpoint}: {self._init_loaded[0].name}")
        return self._init_loaded[0]

    def _check_same_model(self, meta: dict) -> None:
        c, before = self.config, meta.get("config", {})
        group = self.program.objective.settings  # mae.*, mpp.*: they shape the model and its loss
        old = before.get("objective", objectives.DEFAULT_OBJECTIVE)
        if (old, before.get(group) if group else None) != (
                c.objective, c[group].to_dict() if group else None):
            raise config_lib.ConfigError(
                f"{self.workdir} holds a run of objective '{old}' with other "
                f"settings than this config's (objective{f', {group}.*' if group else ''}); use a new --workdir")
        had_ema = float(before.get("ema", {}).get("decay", 0.0))
        if bool(had_ema) != bool(c.ema.decay):  # the state has (or lacks) EMA weights: it would not restore
            raise config_lib.ConfigError(
                f"{self.workdir} holds a run with ema.decay={had_ema}, this config has ema.decay={c.ema.decay} "
                "(EMA weights on in one and off in the other); keep the run's ema.decay or use a new --workdir")
        recorded, mine = meta.get("model", {}), model_meta(self.model_cfg)
        if recorded != mine:
            differ = sorted(k for k in {*recorded, *mine} if recorded.get(k) != mine.get(k))
            raise config_lib.ConfigError(
                f"{self.workdir} holds a run of another model (its {', '.join(differ[:4])} differ from this config's "
                f"{self.model_cfg.name}); use a new --workdir")

    def _initial_state(self) -> dict[str, Any]:
        c = self.config
        if not c.init.checkpoint:
            if c.init.required:
                raise config_lib.ConfigError(
                    "this config fine-tunes a pretrained model but init.checkpoint is empty; pass init=PATH as the "
                    "config argument or --config.init.checkpoint=PATH (an official .npz, timm .safetensors or a run "
                    "dir), or --config.init.required=false to train from scratch")
            return self.program.init_state(c.seed)
        from vit_jax.checkpoints.loading import load_any
        from vit_jax.checkpoints.surgery import adapt_params

        src_cfg, src_params = getattr(self, "_init_loaded", None) or load_any(c.init.checkpoint)
        self._init_loaded = None  # the host copy is not needed once merged
        params, notes = adapt_params(src_params, src_cfg, self.program.init_params_host(c.seed), self.model_cfg,
                                     reinit=tuple(c.init.reinit), posemb_method=c.init.posemb_resize)
        log(f"initialised from {c.init.checkpoint} ({src_cfg.name})" + "".join(f"\n  {n}" for n in notes))
        return self.program.init_state(c.seed, jax.device_put(params, self.param_sh))

    # -----------------------------------------------------------------------------------------------------------------
    def wall_time_s(self) -> float:
        """Wall time of the whole run: earlier segments (to their last checkpoint) plus this one so far."""
        return self._wall_before + time.time() - self.t_start

    def metadata(self) -> dict[str, Any]:
        self.progress["wall_time_s"] = self.wall_time_s()
        return {
            "model": model_meta(self.model_cfg),
            "model_family": family_of(self.model_cfg).name,  # which family's config "model" is
            "config": self.config.to_dict(),
            "dataset": self.ds.description(),
            "pp_train": self.config.data.pp_train,
            "pp_eval": self.config.data.pp_eval,
            "run_files": self.run_files,
            "version": __version__,
            "git_commit": git_commit(),
            "progress": self.progress,
            "hooks": {type(h).__name__: st for h in self._hooks if (st := h.state()) is not None},
        }

    def save_checkpoint(self, step: int, data_state: dict, wait: bool = False) -> None:
        if getattr(self, "writer", None) is not None:
            self.writer.flush()  # in a bucket: the metrics up to `step` are stored before the checkpoint is
        self.ckpt.save(step, self.state, data_state, self.metadata(), wait=wait)

    def _install_preemption_handlers(self):
        """SIGTERM/SIGINT (TPU/SLURM preemption, Ctrl-C) -> finish the step, save, stop (the command then exits 0
        after SIGTERM, 130 after Ctrl-C). Multi-process jobs agree on the step through JAX's preemption sync point
        (the coordination service relays the signal)."""
        if jax.process_count() > 1:
            return []

        def handler(signum, frame):
            del frame
            if self._preempted:  # second signal: give up immediately
                raise KeyboardInterrupt
            self._preempted = signum
            print(f"received signal {signum}: stopping after this step and saving a checkpoint", flush=True)

        return [(s, signal.signal(s, handler)) for s in (signal.SIGTERM, signal.SIGINT)]

    def should_stop(self, step: int) -> bool:
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            return bool(multihost_utils.reached_preemption_sync_point(step))
        return bool(self._preempted)

    # -----------------------------------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        from vit_jax.data import pipeline

        c = self.config
        total = self.dur.total_steps
        peak, peak_source = device_peak_flops()
        self.writer = writer = MetricWriter(self.workdir, enabled=self.is_main, resume_step=self.start_step)
        dev = jax.devices()[0]
        self.hardware = {"device_kind": dev.device_kind, "platform": dev.platform, "num_devices": jax.device_count(),
                         "peak_flops_per_device": peak, "peak_source": peak_source,
                         "tpu_cores_per_device": table_lookup(TPU_CORES, dev.device_kind) if dev.platform == "tpu"
                         else None}
        self._print_startup()
        self.compile_time_s = None  # set when this segment compiles (not when it resumes at the end)
        pp_lib.load_modules(c.data.pp_modules)
        it = pipeline.train_iterator(self.ds, split=c.data.train_split, pp=c.data.pp_train,
                                     global_batch_size=c.batch_size, sharding=self.batch_sh, seed=c.seed,
                                     start_step=self.start_step, fraction=c.data.fraction,
                                     repeats=c.data.repeated_augmentation,
                                     num_workers=c.data.num_workers or None, prefetch=c.data.prefetch,
                                     stream=dict(window=c.data.stream_window, read_ahead=c.data.stream_read_ahead))
        if self.data_state is not None:
            it.explain_resume(self.data_state)  # a bucket stream resumed by another process count: one line
        ctx = hooks_lib.HookContext(
            config=c, workdir=self.workdir, durations=self.dur, start_step=self.start_step,
            train_examples=self.train_examples, dataset=self.ds, program=self.program, hardware=self.hardware,
            progress=self.progress, params=lambda: weights(self.state),
            eval_params=lambda: self.program.eval_view(self.state), save_checkpoint=self.save_checkpoint)
        hooks = self._hooks = hooks_lib.default_hooks(ctx, writer)
        for hook in hooks:
            if type(hook).__name__ in self._hook_states:
                hook.restore(self._hook_states[type(hook).__name__])
        previous = self._install_preemption_handlers()
        step = self.start_step
        try:
            timer = hooks_lib.StepTimer()
            pending = None
            compiled = None
            while step < total:
                if self.should_stop(step):
                    # Every process says where it stopped: a multi-process job must agree on the step.
                    print(f"process {jax.process_index()}: stopping at step {step} to save and exit", flush=True)
                    self.save_checkpoint(step, it.get_state(), wait=True)
                    log(f"preempted: saved checkpoint at step {step}; rerun the same command to resume")
                    return {"status": "preempted", "step": step, "signal": int(self._preempted or signal.SIGTERM)}
                with timer.data():
                    batch = next(it)
                if compiled is None:
                    compiled = self._compile(batch)
                self.state, metrics = compiled(self.state, batch)
                step += 1
                if pending is not None:
                    # Checked one step late (no device sync per step): the state and iterator are already at `step`.
                    self._check_finite(pending, step - 1, step, it)
                pending = metrics
                for hook in hooks:
                    hook.maybe_run(step, metrics, it, timer)
                self.ckpt.check()  # a background save that failed (disk full, ...) stops the run now
            if pending is not None:
                self._check_finite(pending, step, step, it)
            hooks_lib.finish_all(hooks, step, it)
            self.ckpt.wait()
            summary = hooks_lib.write_summary(ctx, step, hooks,
                                              skipped_steps=int(jax.device_get(self.state["skipped"])),
                                              wall_time_s=self.wall_time_s(), compile_time_s=self.compile_time_s)
            return summary
        finally:
            for sig, old in previous:
                signal.signal(sig, old)
            it.close()
            writer.close()
            self.ckpt.wait()

    def _compile(self, batch: dict) -> Any:
        """Ahead-of-time compilation (timed and reported) against the first batch's shapes."""
        expected = tuple(self.program.objective.batch_spec(0)["image"][0][1:])  # a video model's: (T, H, W, 3)
        if tuple(batch["image"].shape[1:]) != expected:
            raise config_lib.ConfigError(
                f"data.pp_train produces images of shape {tuple(batch['image'].shape[1:])} but the model expects "
                f"{expected}; make the preprocessing resize/crop to model.image_size")
        t = time.time()
        spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=self.batch_sh) for k, v in batch.items()}
        compiled = self.program.compile_train_step(spec)
        self.compile_time_s = time.time() - t
        barrier("compiled train step")  # the first step's collectives start together on every process
        log(f"compiled the train step in {self.compile_time_s:.1f}s")
        return compiled

    def _check_finite(self, metrics, step: int, state_step: int, it) -> None:
        """Stops after K consecutive skipped steps (counted up to `step`), saving the state, which is at
        `state_step` (a skipped update leaves the parameters as they were)."""
        consecutive = int(jax.device_get(metrics["consecutive_skips"]))
        if consecutive >= self.config.nan_guard.max_consecutive:
            self.save_checkpoint(state_step, it.get_state(), wait=True)
            raise NonFiniteError(
                f"{consecutive} consecutive steps had a non-finite loss, gradient, update or parameters (or a loss "
                f"spike) up to step {step}; stopped. "
                f"The last good state is saved in {self.ckpt.directory}; lower optimizer.lr or check the data")

    def _print_startup(self) -> None:
        c, m = self.config, self.model_cfg
        dp = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        log(f"vit_jax {__version__} | {jax.process_count()} process(es), {jax.device_count()} x "
            f"{self.hardware['device_kind']} | mesh {dict(self.mesh.shape)}")
        log(f"model {m.name} ({self.model.num_params():,} params, {self.flops_per_image / 3e9:.2f} GFLOP/img fwd) | "
            f"data {c.data.name}: {self.train_examples} train examples, {self.ds.num_classes} classes")
        if (att := self.program.attention) is not None:
            log(f"attention: {att['used']} ({att['why']})")
        log(f"batch {c.batch_size} ({c.batch_size // dp} per device, {c.micro_batches} micro-batches) | "
            f"{self.dur.total_steps} steps ({self.dur.total_steps / self.dur.steps_per_epoch:.2f} epochs), "
            f"warmup {self.dur.warmup_steps} | peak {self.hardware['peak_flops_per_device'] / 1e12:.2f} TFLOP/s "
            f"per device ({self.hardware['peak_source']})")

