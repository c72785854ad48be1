"""The one trainer: pretraining, fine-tuning and evaluation share this set-up and loop; behaviour differs by config
and by the hooks that run at their step intervals (logging, evaluation, few-shot, checkpoints).

Set-up order matters for multi-host runs: the dataset is prepared by process 0 first; the state is initialised by a
jitted function directly into its target shardings (no host copy of a large model), or restored from the latest
complete checkpoint in the workdir (auto-resume), or built from a pretrained checkpoint (fine-tuning).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import __version__
from vit_jax.checkpoints.training import RunCheckpointer, git_commit, model_meta
from vit_jax.models.flops import vit_flops
from vit_jax.models.sharding_hints import activation_sharding
from vit_jax.models.vit import FunctionalViT
from vit_jax.parallel import mesh as mesh_lib
from vit_jax.train import config as config_lib
from vit_jax.train import hooks as hooks_lib
from vit_jax.train.metrics import MetricWriter, device_peak_flops, table_lookup, TPU_CORES
from vit_jax.train.optimizer import make_optimizer, make_schedule
from vit_jax.train.step import init_state, make_eval_step, make_train_step


class NonFiniteError(RuntimeError):
    """Too many consecutive non-finite steps."""


def log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


class Trainer:
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        config_lib.validate(config)
        self.config = config
        self.workdir = workdir
        self.is_main = jax.process_index() == 0
        if self.is_main:
            os.makedirs(workdir, exist_ok=True)
        self.t_start = time.time()
        self._setup_data()
        self._setup_model_and_optimizer()
        self._setup_state()
        self._preempted = False

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
        c = self.config
        self.model_cfg = config_lib.model_config(c, self.ds.num_classes)
        self.model = FunctionalViT(self.model_cfg)
        self.mesh = mesh_lib.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
        dp = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if c.batch_size % (dp * c.micro_batches) or c.batch_size % jax.process_count():
            raise config_lib.ConfigError(
                f"batch_size {c.batch_size} must divide evenly over {dp} data-parallel devices x "
                f"{c.micro_batches} micro-batches and {jax.process_count()} processes")
        self.schedule = make_schedule(c.optimizer, self.dur.total_steps, self.dur.warmup_steps)
        self.tx = make_optimizer(c.optimizer, self.schedule, self.model.shapes)
        self.flops_per_image = vit_flops(self.model_cfg).train

        m = self.mesh
        self.param_sh = mesh_lib.tree_shardings(self.model.logical_axes, self.model.shapes, m)
        abstract = jax.eval_shape(lambda p: init_state(p, self.tx, jax.random.key_data(jax.random.key(0))),
                                  self.model.shapes)
        rep = mesh_lib.replicated(m)
        self.state_sh = {k: rep for k in abstract}
        self.state_sh["params"] = self.param_sh
        self.state_sh["opt_state"] = mesh_lib.shardings_like_params(abstract["opt_state"], self.param_sh,
                                                                     self.model.shapes, m)
        self.abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                           abstract, self.state_sh)
        self.batch_sh = mesh_lib.batch_sharding(m)
        resolver = mesh_lib.activation_resolver(m)

        def with_hints(fn):
            def wrapped(*args):
                with activation_sharding(resolver):  # active while jit traces
                    return fn(*args)
            return wrapped

        step_fn = make_train_step(self.model, self.tx, self.schedule, loss_kind=c.loss.kind,
                                  micro_batches=c.micro_batches, label_smoothing=c.loss.label_smoothing,
                                  mixup_alpha=c.loss.mixup_alpha)
        self.train_step = jax.jit(with_hints(step_fn), in_shardings=(self.state_sh, self.batch_sh),
                                  out_shardings=(self.state_sh, rep), donate_argnums=0)
        self.eval_step = jax.jit(with_hints(make_eval_step(self.model, c.loss.kind)),
                                 in_shardings=(self.param_sh, self.batch_sh), out_shardings=rep)

    def _setup_state(self) -> None:
        c = self.config
        ck = c.checkpoint
        self.ckpt = RunCheckpointer(os.path.join(self.workdir, "checkpoints"), keep=ck.keep,
                                    keep_every=ck.keep_every_steps, async_save=ck.async_save)
        self.progress = {"train_time_s": 0.0, "best": {}}
        latest = self.ckpt.latest_step()
        if latest is not None:
            self.state, data_state, meta = self.ckpt.restore(latest, self.abstract_state)
            if meta.get("model") != model_meta(self.model_cfg):
                raise config_lib.ConfigError(
                    f"{self.workdir} holds a run of a different model ({meta.get('model', {}).get('width')}-wide); "
                    "use a new --workdir")
            self.progress = meta.get("progress", self.progress)
            self.start_step = int(data_state["step"])
            assert self.start_step == int(self.state["step"]), (self.start_step, int(self.state["step"]))
            log(f"resumed from {self.ckpt.directory}/{latest} (step {self.start_step})")
        else:
            self.state = self._initial_state()
            self.start_step = 0

    def _initial_state(self) -> dict[str, Any]:
        c = self.config
        key = jax.random.key(c.seed)
        params_key, train_key = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
        make = jax.jit(lambda k, p: init_state(p, self.tx, jax.random.key_data(k)), out_shardings=self.state_sh)
        if not c.init.checkpoint:
            init_params = jax.jit(self.model.init, out_shardings=self.param_sh)(params_key)
            return make(train_key, init_params)
        from vit_jax.checkpoints.loading import load_any
        from vit_jax.checkpoints.surgery import adapt_params

        src_cfg, src_params = load_any(c.init.checkpoint)
        fresh = jax.device_get(jax.jit(self.model.init)(params_key))
        params, notes = adapt_params(src_params, src_cfg, fresh, self.model_cfg, reinit=tuple(c.init.reinit),
                                     posemb_method=c.init.posemb_resize)
        log(f"initialised from {c.init.checkpoint} ({src_cfg.name})" + "".join(f"\n  {n}" for n in notes))
        return make(train_key, jax.device_put(params, self.param_sh))

    # -----------------------------------------------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        return {
            "model": model_meta(self.model_cfg),
            "config": self.config.to_dict(),
            "dataset": self.ds.description(),
            "pp_train": self.config.data.pp_train,
            "pp_eval": self.config.data.pp_eval,
            "version": __version__,
            "git_commit": git_commit(),
            "progress": self.progress,
        }

    def save_checkpoint(self, step: int, data_state: dict, wait: bool = False) -> None:
        self.ckpt.save(step, self.state, data_state, self.metadata(), wait=wait)

    def _install_preemption_handlers(self):
        """SIGTERM/SIGINT (TPU/SLURM preemption, Ctrl-C) -> finish the step, save, exit 0. Multi-process jobs agree
        on the step through JAX's preemption sync point (the coordination service relays the signal)."""
        if jax.process_count() > 1:
            return []

        def handler(signum, frame):
            del frame
            if self._preempted:  # second signal: give up immediately
                raise KeyboardInterrupt
            self._preempted = True
            print(f"received signal {signum}: stopping after this step and saving a checkpoint", flush=True)

        return [(s, signal.signal(s, handler)) for s in (signal.SIGTERM, signal.SIGINT)]

    def should_stop(self, step: int) -> bool:
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            return bool(multihost_utils.reached_preemption_sync_point(step))
        return self._preempted

    # -----------------------------------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        from vit_jax.data import pipeline

        c = self.config
        total = self.dur.total_steps
        peak, peak_source = device_peak_flops()
        writer = MetricWriter(self.workdir, enabled=self.is_main)
        dev = jax.devices()[0]
        self.hardware = {"device_kind": dev.device_kind, "platform": dev.platform, "num_devices": jax.device_count(),
                         "peak_flops_per_device": peak, "peak_source": peak_source,
                         "tpu_cores_per_device": table_lookup(TPU_CORES, dev.device_kind) if dev.platform == "tpu"
                         else None}
        self._print_startup()
        it = pipeline.train_iterator(self.ds, split=c.data.train_split, pp=c.data.pp_train,
                                     global_batch_size=c.batch_size, sharding=self.batch_sh, seed=c.seed,
                                     start_step=self.start_step, fraction=c.data.fraction,
                                     num_workers=c.data.num_workers or None, prefetch=c.data.prefetch)
        hooks = hooks_lib.default_hooks(self, writer)
        previous = self._install_preemption_handlers()
        step = self.start_step
        try:
            timer = hooks_lib.StepTimer()
            pending = None
            compiled = None
            while step < total:
                if self.should_stop(step):
                    self.save_checkpoint(step, it.get_state(), wait=True)
                    log(f"preempted: saved checkpoint at step {step}; rerun the same command to resume")
                    return {"status": "preempted", "step": step}
                with timer.data():
                    batch = next(it)
                if compiled is None:
                    compiled = self._compile(batch)
                with timer.step():
                    self.state, metrics = compiled(self.state, batch)
                step += 1
                if pending is not None:
                    self._check_finite(pending, step - 1, it)
                pending = metrics
                for hook in hooks:
                    hook.maybe_run(step, metrics, it, timer)
            if pending is not None:
                self._check_finite(pending, step, it)
            for hook in hooks:
                hook.finish(step, it)
            self.ckpt.wait()
            summary = hooks_lib.write_summary(self, step, hooks)
            return summary
        finally:
            for sig, old in previous:
                signal.signal(sig, old)
            it.close()
            writer.close()
            self.ckpt.wait()

    def _compile(self, batch: dict) -> Any:
        """Ahead-of-time compilation (timed and reported) against the first batch's shapes."""
        expected = (*self.model_cfg.image_size, 3)
        if tuple(batch["image"].shape[1:]) != expected:
            raise config_lib.ConfigError(
                f"data.pp_train produces images of shape {tuple(batch['image'].shape[1:])} but the model expects "
                f"{expected}; make the preprocessing resize/crop to model.image_size")
        t = time.time()
        spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=self.batch_sh) for k, v in batch.items()}
        compiled = self.train_step.lower(self.abstract_state, spec).compile()
        self.compile_time_s = time.time() - t
        log(f"compiled the train step in {self.compile_time_s:.1f}s")
        return compiled

    def _check_finite(self, metrics, step: int, it) -> None:
        consecutive = int(jax.device_get(metrics["consecutive_skips"]))
        if consecutive >= self.config.nan_guard.max_consecutive:
            self.save_checkpoint(step, it.get_state(), wait=True)
            raise NonFiniteError(
                f"{consecutive} consecutive steps had a non-finite loss or gradient (up to step {step}); stopped. "
                f"The last good state is saved in {self.ckpt.directory}; lower optimizer.lr or check the data")

    def _print_startup(self) -> None:
        c, m = self.config, self.model_cfg
        dp = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        log(f"vit_jax {__version__} | {jax.process_count()} process(es), {jax.device_count()} x "
            f"{self.hardware['device_kind']} | mesh {dict(self.mesh.shape)}")
        log(f"model {m.name} ({self.model.num_params():,} params, {self.flops_per_image / 3e9:.2f} GFLOP/img fwd) | "
            f"data {c.data.name}: {self.train_examples} train examples, {self.ds.num_classes} classes")
        log(f"batch {c.batch_size} ({c.batch_size // dp} per device, {c.micro_batches} micro-batches) | "
            f"{self.dur.total_steps} steps ({self.dur.total_steps / self.dur.steps_per_epoch:.2f} epochs), "
            f"warmup {self.dur.warmup_steps} | peak {self.hardware['peak_flops_per_device'] / 1e12:.2f} TFLOP/s "
            f"per device ({self.hardware['peak_source']})")


def evaluate_checkpoint(trainer: Trainer) -> dict[str, float]:
    """Standalone evaluation of the trainer's current params (for `vit-jax eval`)."""
    return hooks_lib.run_eval(trainer)
