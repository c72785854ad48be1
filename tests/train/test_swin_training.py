"""The one trainer trains a Swin: a tiny one by name on a data x fsdp mesh of the 8 simulated devices, its parameters
sharded by their logical axes, its checkpoint read back as a Swin, and a run stopped at a checkpoint and resumed ending
bit-identical to an uninterrupted one (the same program every time: one compile, through the persistent cache)."""

import json
import shutil

import jax

import numpy as np
import pytest

from tests.train.helpers import demo_config
from vit_jax.checkpoints.loading import load_any
from vit_jax.models.swin_config import SwinConfig
from vit_jax.train.trainer import Trainer

# configs/demo.py's ViT sizes back at their defaults, and a two-stage Swin of width 32 (16x16 digits: grids 4 and 2,
# the first in shifted 2x2 windows) instead, with drop path on (its keys must resume too).
SWIN = {"model.variant": "Swin-32-2-1", "model.window_size": 2, "model.image_size": 16, "model.drop_path": 0.1,
        "model.width": 0, "model.depth": 0, "model.mlp_dim": 0, "model.num_heads": 0, "model.patch_size": 0,
        "model.pool": "token", "mesh.data": 2, "mesh.fsdp": 4,
        "data.pp_train": "decode|resize(16)|value_range(-1,1)", "data.pp_eval": "decode|resize(16)|value_range(-1,1)"}


def losses(workdir: str) -> dict[int, float]:
    rows = [json.loads(line) for line in open(f"{workdir}/metrics.jsonl")]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, digits_data_dir):
    workdir = str(tmp_path_factory.mktemp("swin"))
    c = demo_config(digits_data_dir, **SWIN, total_steps=4, batch_size=16, **{"checkpoint.every_steps": 2})
    trainer = Trainer(c, workdir)
    summary = trainer.train()
    return workdir, summary, trainer


def test_two_steps_on_a_data_by_fsdp_mesh(uninterrupted):
    workdir, summary, trainer = uninterrupted
    assert summary["steps"] == 4 and np.isfinite(summary["final"]["eval/loss"])
    assert summary["model"]["family"] == "Swin" and summary["compute"]["train_flops_per_image"] > 0
    first = losses(workdir)[1]
    assert first == pytest.approx(np.log(10), abs=1e-5)  # the zero-initialised head: uniform logits
    cfg, params = load_any(workdir)  # a Swin run reads back as a Swin
    assert isinstance(cfg, SwinConfig) and cfg.name == "Swin-32-2-1" and cfg.num_classes == 10
    assert cfg.window_size == 2 and cfg.drop_path == 0.1 and cfg.image_size == (16, 16)
    assert np.abs(params["head"]["kernel"]).max() > 0  # trained
    mesh = dict(trainer.program.mesh.shape)
    assert (mesh["data"], mesh["fsdp"]) == (2, 4)


def test_a_run_resumed_from_its_step_2_checkpoint_ends_bit_identical(uninterrupted, tmp_path, digits_data_dir):
    full, _, _ = uninterrupted
    workdir = str(tmp_path / "resumed")
    shutil.copytree(full, workdir)
    shutil.rmtree(f"{workdir}/checkpoints/4")  # as if stopped right after the step-2 checkpoint
    c = demo_config(digits_data_dir, **SWIN, total_steps=4, batch_size=16, **{"checkpoint.every_steps": 2})
    trainer = Trainer(c, workdir)
    assert trainer.start_step == 2
    trainer.train()
    (_, resumed), (_, reference) = load_any(workdir), load_any(full)
    assert jax.tree.all(jax.tree.map(np.array_equal, resumed, reference))


@pytest.mark.parametrize("name,arg,variant,drop_path", [("swin_i1k", "variant=Swin-B", "Swin-B", 0.5),
                                                         ("swin_i1k", None, "Swin-T", 0.2),
                                                         ("demo_swin", None, "Swin-32-2-2", 0.0)])
def test_shipped_swin_configs_validate_and_build_a_swin(name, arg, variant, drop_path):
    import importlib.util

    from tests.train.helpers import ROOT
    from vit_jax.train.config import model_config, validate

    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config(arg)
    validate(c)
    cfg = model_config(c, 10)
    assert isinstance(cfg, SwinConfig) and cfg.name == variant and cfg.drop_path == drop_path
    if name == "demo_swin":  # 2x2 patches: an 8x8 grid in shifted 4x4 windows, then one 4x4 window
        assert cfg.patch_size == (2, 2) and [cfg.stage_window(s) for s in (0, 1)] == [((4, 4), (2, 2)),
                                                                                     ((4, 4), (0, 0))]
