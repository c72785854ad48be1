"""Training checkpoints with Orbax: state (params, optimizer, step, RNG), data-iterator state and run metadata.

Layout: `WORKDIR/checkpoints/<step>/{state,data,meta}`. Saves are asynchronous and atomic (Orbax writes to a
temporary directory and renames it when complete; an interrupted save is never restored). The metadata makes a
checkpoint self-describing: model architecture, resolved config, dataset and preprocessing, package version and
git commit — `vit-jax predict/eval/convert` need nothing else.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from vit_jax.models.config import ViTConfig

ITEMS = ("state", "data", "meta")


class RunCheckpointer:
    """Thin policy layer over ocp.CheckpointManager: keep the last `keep` plus every `keep_every`-th step."""

    def __init__(self, directory: str, *, keep: int = 3, keep_every: int = 0, async_save: bool = True):
        self.directory = epath.Path(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep or None, keep_period=keep_every or None, enable_async_checkpointing=async_save,
            create=True, cleanup_tmp_directories=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, data_state: dict, meta: dict, *, wait: bool = False) -> None:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
                                  meta=ocp.args.JsonSave(meta))
        # A step saved already (a periodic save, then a preemption or the end of the run at that same step) holds
        # this very state: saving is idempotent, never Orbax's StepAlreadyExistsError. Orbax waits for the previous
        # save before its own check too, so this costs no extra blocking.
        self.manager.wait_until_finished()
        if step not in self.manager.all_steps():
            self.manager.save(step, args=args, force=True)
        if wait:
            self.manager.wait_until_finished()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
        """Restores onto the shardings of `abstract_state` (jax.ShapeDtypeStruct leaves with `.sharding`): any
        device count or mesh works, whatever the checkpoint was saved with."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
                                  meta=ocp.args.JsonRestore())
        out = self.manager.restore(step, args=args)
        return out["state"], out["data"], out["meta"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def _step_dir(path: str) -> epath.Path:
    """A run workdir, its checkpoints/ folder or one step folder -> the step folder to read."""
    p = epath.Path(path)
    if (p / "checkpoints").exists():
        p = p / "checkpoints"
    if (p / "meta").exists() and (p / "state").exists():
        return p
    # Finalized steps only: in a bucket Orbax writes a step in place and marks it complete last (commit_success.txt).
    steps = sorted(int(c.name) for c in p.iterdir()
                   if c.name.isdigit() and ocp.step.is_path_finalized(c)) if p.exists() else []
    if not steps:
        raise FileNotFoundError(f"no complete checkpoint under {path} (expected WORKDIR/checkpoints/<step>/)")
    return p / str(steps[-1])


def load_run_metadata(path: str) -> dict:
    step_dir = _step_dir(path)
    return json.loads((step_dir / "meta" / "metadata").read_text())


def model_config_from_meta(meta: dict) -> ViTConfig:
    from vit_jax.models.config import vit_config

    return vit_config(**meta["model"])


def load_params_from_run(path: str) -> tuple[ViTConfig, dict[str, Any]]:
    """Parameters (numpy) and architecture of one of our checkpoints, restored onto this host's CPU memory."""
    from vit_jax.models.vit import FunctionalViT

    step_dir = _step_dir(path)
    cfg = model_config_from_meta(load_run_metadata(str(step_dir)))
    shapes = FunctionalViT(cfg).shapes
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {"params": jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)}
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    with ocp.PyTreeCheckpointer() as ckptr:
        out = ckptr.restore(step_dir / "state", args=ocp.args.PyTreeRestore(
            item=target, restore_args=restore_args, partial_restore=True))
    return cfg, jax.tree.map(np.asarray, out["params"])


def model_meta(cfg: ViTConfig) -> dict:
    """ViTConfig -> JSON-able dict that `vit_config(**meta)` rebuilds exactly."""
    import dataclasses

    d = dataclasses.asdict(cfg)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


def git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    head = os.path.join(here, "..", "..", ".git", "HEAD")
    try:
        with open(head) as f:
            ref = f.read().strip()
        if ref.startswith("ref: "):
            with open(os.path.join(here, "..", "..", ".git", ref[5:])) as f:
                return f.read().strip()
        return ref
    except OSError:
        return None
