"""The compiled side of training: model, mesh, optimizer, shardings and the jitted steps, built from a config.

The trainer, the benchmarks (`vit-jax bench train`) and the memory planner (`vit-jax plan`) all use this one
construction, so what is benchmarked and planned is exactly what trains.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh, NamedSharding

from vit_jax.models.build import ModelConfig
from vit_jax.models import attention_impl
from vit_jax.models.sharding_hints import activation_sharding
from vit_jax.models.vit import FunctionalViT
from vit_jax.parallel import mesh as mesh_lib
from vit_jax.parallel.distributed import SyncedJit
from vit_jax.runtime import jit_once
from vit_jax.train import config as config_lib
from vit_jax.train.ema import EMA_PARAMS, weights
from vit_jax.train.objectives import Objective, make_objective, objective_class
from vit_jax.train.optimizer import make_optimizer, make_schedule
from vit_jax.train.step import init_state, make_train_step


@dataclasses.dataclass
class TrainProgram:
    config: ml_collections.ConfigDict
    model_cfg: ModelConfig
    model: FunctionalViT
    mesh: Mesh
    schedule: optax.Schedule
    tx: optax.GradientTransformation
    param_sh: Any
    state_sh: Any
    batch_sh: NamedSharding
    abstract_state: Any  # ShapeDtypeStructs carrying their target shardings
    train_step: Callable  # jitted (state, batch) -> (state, metrics); the state argument is donated
    eval_step: Callable  # jitted (params, batch) -> sums
    flops_per_image: float  # analytic training FLOPs per image
    objective: Objective  # what the run learns: model, loss, eval step, extra state (train/objectives/)
    extra_sh: Any = None  # shardings of the objective's extra state (state["extra"]); None: it has none
    attention: dict[str, str] | None = None  # the attention kernel requested and used (models/attention_impl.py)

    def init_state(self, seed: int, params: Any | None = None) -> dict[str, Any]:
        """Fresh state straight into its shardings (no host copy); or around given (already sharded) params."""
        spike, ema = bool(self.config.nan_guard.loss_spike_factor), bool(self.config.ema.decay)
        base_sh = {k: v for k, v in self.state_sh.items() if k != "extra"}
        make = jit_once(lambda k, p: init_state(p, self.tx, jax.random.key_data(k), spike, ema),
                        out_shardings=base_sh)
        fresh = self._fresh(seed, params)
        return {**make(jax.random.fold_in(jax.random.key(seed), 1), fresh["params"]),
                **({"extra": fresh["extra"]} if "extra" in fresh else {})}

    def init_eval_view(self, seed: int) -> Any:
        """Fresh parameters (and extra state) in their shardings, as the eval step reads them (benchmarks)."""
        return self.eval_view(self._fresh(seed))

    def _fresh(self, seed: int, params: Any | None = None) -> dict[str, Any]:
        """Fresh parameters (unless given; key fold_in(seed, 0)) and the objective's extra state (fold_in(seed, 2):
        a frozen or EMA teacher's weights), in their shardings."""
        key = jax.random.key(seed)
        if params is None:
            params = jit_once(self.model.init, out_shardings=self.param_sh)(jax.random.fold_in(key, 0))
        if self.extra_sh is None:
            return {"params": params}
        k_extra = jax.random.fold_in(key, 2)
        if self.objective.extra_from_params:  # e.g. an EMA teacher starting as the student's copy, made in place
            extra = jit_once(self.objective.init_extra, out_shardings=self.extra_sh)(k_extra, params)
        else:
            extra = jax.device_put(self.objective.init_extra(k_extra), self.extra_sh)
        return {"params": params, "extra": extra}

    def eval_view(self, state: dict[str, Any]) -> Any:
        """What the eval step reads of a train state: the run's weights (the parameters, or their EMA when the run
        keeps one: train/ema.py), and (weights, extra) with extra state."""
        return weights(state) if self.extra_sh is None else (weights(state), state["extra"])

    def init_params_host(self, seed: int) -> Any:
        """The fresh parameters on the host (fine-tuning surgery merges pretrained weights into them)."""
        return jax.device_get(jit_once(self.model.init)(jax.random.fold_in(jax.random.key(seed), 0)))

    def batch_spec(self, global_batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        """Abstract global training batch of the objective (for ahead-of-time compilation without data)."""
        return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sh)
                for k, (shape, dtype) in self.objective.batch_spec(global_batch_size).items()}

    def eval_batch_spec(self, global_batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        """Abstract global eval batch: a training batch plus `_mask` (1 for real rows, 0 for padding)."""
        spec = self.batch_spec(global_batch_size)
        spec["_mask"] = jax.ShapeDtypeStruct((global_batch_size,), jnp.float32, sharding=self.batch_sh)
        return spec

    def abstract_eval_view(self) -> Any:
        """The eval step's first argument, abstract (as `eval_view` of abstract_state)."""
        return self.eval_view(self.abstract_state)

    def compile_train_step(self, batch_spec: dict[str, jax.ShapeDtypeStruct]):
        return self.train_step.lower(self.abstract_state, batch_spec).compile()


def build_program(config: ml_collections.ConfigDict, num_classes: int, durations: config_lib.Durations,
                  devices: Sequence[Any] | None = None, architecture: ModelConfig | None = None) -> TrainProgram:
    """`architecture`: the init checkpoint's ViTConfig, for configs that take their model from it."""
    c = config
    # An MAE model has no head: the dataset's classes are for the fine-tuning that follows; a segmentation model's
    # classes are those of its pixel labels (segmentation.num_classes).
    model_cfg = config_lib.model_config(c, objective_class(c.objective).head_classes(c, num_classes), architecture)
    objective = make_objective(c, model_cfg)
    objective.total_steps = durations.total_steps  # for the objective's own schedules (DINO's teacher)
    model = objective.model
    mesh = mesh_lib.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor, devices=devices)
    device = mesh.devices.flat[0]
    attention = attention_impl.for_model(model_cfg, device.platform, device.device_kind)  # refuses a kernel it lacks
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    if c.batch_size % (dp * c.micro_batches) or c.batch_size % jax.process_count():
        raise config_lib.ConfigError(
            f"batch_size {c.batch_size} must divide evenly over {dp} data-parallel devices x {c.micro_batches} "
            f"micro-batches and {jax.process_count()} processes")
    schedule = make_schedule(c.optimizer, durations.total_steps, durations.warmup_steps)
    tx = make_optimizer(c.optimizer, schedule, model.shapes)

    param_sh = mesh_lib.tree_shardings(model.logical_axes, model.shapes, mesh)
    spike, ema_decay = float(c.nan_guard.loss_spike_factor), float(c.ema.decay)
    abstract = jax.eval_shape(
        lambda p: init_state(p, tx, jax.random.key_data(jax.random.key(0)), bool(spike), bool(ema_decay)),
        model.shapes)
    rep = mesh_lib.replicated(mesh)
    state_sh = {k: rep for k in abstract}
    state_sh["params"] = param_sh
    if ema_decay:
        state_sh[EMA_PARAMS] = param_sh
    state_sh["opt_state"] = mesh_lib.shardings_like_params(abstract["opt_state"], param_sh, model.shapes, mesh)
    extra_sh = None
    extra_shapes = objective.extra_shapes()
    if extra_shapes is not None:  # sharded by the same logical-axis rules as the parameters
        axes = objective.extra_logical_axes()
        extra_sh = (mesh_lib.tree_shardings(axes, extra_shapes, mesh) if axes is not None
                    else jax.tree.map(lambda _: rep, extra_shapes))
        abstract["extra"], state_sh["extra"] = extra_shapes, extra_sh
    abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, state_sh)
    eval_view_sh = param_sh if extra_sh is None else (param_sh, extra_sh)
    batch_sh = mesh_lib.batch_sharding(mesh)
    resolver = mesh_lib.activation_resolver(mesh)

    def with_hints(fn):
        def wrapped(*args):
            # active while jit traces the step: activation shardings, and the devices attention is chosen for
            with activation_sharding(resolver), attention_impl.lowering_for(device.device_kind):
                return fn(*args)

        return wrapped

    step_fn = make_train_step(objective, tx, schedule, micro_batches=c.micro_batches, loss_spike_factor=spike,
                              ema_decay=ema_decay)
    train_step = jax.jit(with_hints(step_fn), in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, rep),
                         donate_argnums=0)
    eval_step = SyncedJit(jax.jit(with_hints(objective.eval_step()), in_shardings=(eval_view_sh, batch_sh),
                                  out_shardings=rep), "eval step")
    return TrainProgram(config=c, model_cfg=model_cfg, model=model, mesh=mesh, schedule=schedule, tx=tx,
                        param_sh=param_sh, state_sh=state_sh, batch_sh=batch_sh, abstract_state=abstract_state,
                        train_step=train_step, eval_step=eval_step, flops_per_image=objective.flops.train,
                        objective=objective, extra_sh=extra_sh, attention=attention)
