"""What `vit-jax plan` compiles: the trainer's own config and program, on simulated CPU devices or a TPU topology.

A plan request (a "spec", a JSON-able dict) describes the run either by model flags (--variant, --batch-size, --mesh,
...: the benchmarks' arguments, turned into a training config by vit_jax.bench.common) or by a trainer config file
with its overrides, read exactly as `python -m vit_jax.main --config=FILE[:ARGS] --config.KEY=VALUE` reads them. The
search of `--suggest` changes only `remat`, `micro_batches` and `mesh`, which override either.
"""

from __future__ import annotations

import argparse
from typing import Any

import ml_collections

# Spec keys that the search (or a flag) sets on top of whatever the run's config says.
SEARCHED = ("remat", "micro_batches", "mesh")


def load_trainer_config(config: str, overrides: list[str]) -> ml_collections.ConfigDict:
    """`configs/x.py[:ARGS]` plus `--config.KEY=VALUE` overrides, parsed by the trainer's own flag machinery."""
    from absl import flags
    from ml_collections import config_flags

    from vit_jax.train import config as config_lib

    config_lib.check_override_keys(overrides)
    argv = ["vit-jax plan", f"--config={config}", *overrides]
    values = flags.FlagValues()  # private flags: ml_collections finds the overrides in `sys_argv`, not sys.argv
    holder = config_flags.DEFINE_config_file("config", None, "trainer config", flag_values=values, lock_config=False,
                                             sys_argv=argv)
    values(argv)
    c = holder.value
    config_lib.validate(c)
    return c


def stage_config(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """The config of one stage of a multi-stage config, as the trainer runs it (train/stages.py)."""
    from vit_jax.train.stages import stage_configs

    stages = dict(stage_configs(config, workdir="WORKDIR"))
    if name not in stages:
        raise SystemExit(f"--stage {name}: the config's stages are {', '.join(stages) or 'none'}")
    return stages[name]


def num_classes_of(config: ml_collections.ConfigDict) -> int:
    """The dataset's class count the trainer would give the objective, read from its builder (no data needed); 0
    when the objective's model takes no head size from the dataset (MAE, segmentation: train/objectives/)."""
    from vit_jax.data.datasets import Dataset, make_builder
    from vit_jax.train.objectives import objective_class

    if objective_class(config.objective).head_classes(config, 1) == 0:
        return 0
    name = config.data.name
    try:
        n = Dataset(name, make_builder(name, config.data.data_dir or "/nonexistent")).num_classes
    except Exception as e:  # noqa: BLE001 - any failure means the same thing to the user
        raise SystemExit(f"cannot tell the number of classes of dataset {name!r} ({e}); pass --num-classes N") from e
    if not n:
        raise SystemExit(f"dataset {name!r} declares no class count; pass --num-classes N")
    return n


def spec_config(spec: dict[str, Any]) -> ml_collections.ConfigDict:
    """The training config a spec describes, with the searched keys applied."""
    from vit_jax.bench import common
    from vit_jax.train import config as config_lib

    if spec.get("config"):
        c = load_trainer_config(spec["config"], list(spec.get("overrides", ())))
        if spec.get("stage"):
            c = stage_config(c, spec["stage"])
    else:
        ns = argparse.Namespace(**spec)
        c = common.training_config(ns, optimizer=spec.get("optimizer", "adamw"), mu_dtype=spec.get("mu_dtype",
                                   "float32"), micro_batches=spec.get("micro_batches", 1))
    if spec.get("remat") is not None:
        c.model.remat = spec["remat"]
    if spec.get("micro_batches") is not None:
        c.micro_batches = int(spec["micro_batches"])
    if spec.get("mesh"):
        c.mesh.data, c.mesh.fsdp, c.mesh.tensor = common.parse_mesh(spec["mesh"])
    config_lib.validate(c)
    return c


def resolve(spec: dict[str, Any], num_devices: int) -> dict[str, Any]:
    """The spec with everything the planner reports filled in from the config: batch, remat, micro-batches, the
    mesh as data,fsdp,tensor over `num_devices` (resolving -1), dtype, scan and the head size."""
    c = spec_config(spec)
    out = dict(spec)
    data, fsdp, tensor = c.mesh.data, c.mesh.fsdp, c.mesh.tensor
    known = max(1, fsdp) * max(1, tensor) * (data if data > 0 else 1)
    if data == -1:
        data = num_devices // known if num_devices % known == 0 else -1
    if data < 1 or data * fsdp * tensor != num_devices:
        raise SystemExit(f"mesh data={c.mesh.data} x fsdp={fsdp} x tensor={tensor} does not fit {num_devices} "
                         "devices; set --mesh or --config.mesh.*")
    out.update(batch=c.batch_size, remat=c.model.remat, micro_batches=c.micro_batches, dtype=c.model.dtype,
               scan=c.model.scan, mesh=f"{data},{fsdp},{tensor}", devices=num_devices,
               optimizer=c.optimizer.name, mu_dtype=c.optimizer.mu_dtype, variant=c.model.variant or "custom")
    if spec.get("config") and not spec.get("num_classes"):
        out["num_classes"] = num_classes_of(c)
    return out


def build(spec: dict[str, Any], devices=None):
    """The TrainProgram of a (resolved) spec on `devices` (default: the first data*fsdp*tensor of this process)."""
    from vit_jax.bench import common
    from vit_jax.train import config as config_lib
    from vit_jax.train.program import build_program

    c = spec_config(spec)
    # Durations only set the learning-rate schedule's constants, which do not change what is compiled.
    steps = max(1, c.total_steps or 1000)
    durations = config_lib.Durations(total_steps=steps, warmup_steps=0, steps_per_epoch=float(steps), eval_every=0,
                                      checkpoint_every=0, fewshot_every=0)
    if devices is None:
        devices = common.mesh_devices(common.parse_mesh(spec["mesh"]))
    architecture = None
    if not c.model.variant and c.init.checkpoint:  # a fine-tuning config taking its model from init, as the trainer
        from vit_jax.checkpoints.loading import load_any

        architecture = load_any(c.init.checkpoint)[0]
    return build_program(c, int(spec["num_classes"]), durations, devices=devices, architecture=architecture)


def describe(program, batch: int) -> dict[str, Any]:
    """What every plan reports before compiling: the model, the mesh and the per-device bytes of the train state
    (from its shardings) and of the batch."""
    from vit_jax.bench import common

    state = program.abstract_state
    mesh = dict(program.mesh.shape)
    return {
        "model": program.model_cfg.name, "params": program.model.num_params(), "devices": program.mesh.size,
        "num_devices": program.mesh.size, "mesh": mesh, "batch": batch,
        "per_device_batch": batch // (mesh["data"] * mesh["fsdp"]), "micro_batches": program.config.micro_batches,
        "remat": program.model_cfg.remat, "dtype": program.model_cfg.dtype,
        "scan": getattr(program.model_cfg, "scan", False),  # a BiT ResNet has no layers to scan
        "attention": program.attention,  # the kernel requested / used on the plan's platform, and why
        "optimizer": program.config.optimizer.name, "mu_dtype": program.config.optimizer.mu_dtype,
        "params_bytes_total": common.tree_bytes(state["params"]),
        "params_bytes_per_device": common.tree_bytes_per_device(state["params"]),
        "opt_state_bytes_total": common.tree_bytes(state["opt_state"]),
        "opt_state_bytes_per_device": common.tree_bytes_per_device(state["opt_state"]),
        "batch_bytes_per_device": common.tree_bytes_per_device(program.batch_spec(batch)),
        "state_bytes_per_device": common.tree_bytes_per_device(state),
    }
