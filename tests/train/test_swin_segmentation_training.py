"""A Swin segments in the one trainer: configs/demo_swin_seg.py made tiny trains 2 steps on the generated mosaics,
its logits have the label maps' shape, eval/miou reaches the summary, and a run stopped at its step-1 checkpoint and
resumed ends bit-identical to an uninterrupted one. The demo's accuracy is benchmarks/demo_swin_seg.sh's to assert."""

import json
import shutil

import jax
import numpy as np
import pytest

from tests.train.helpers import ROOT, apply_overrides
from vit_jax.checkpoints.training import load_params_from_run
from vit_jax.models.swin_config import SwinConfig
from vit_jax.train.trainer import Trainer


def tiny_config(data_dir: str):
    """The demo at one block per stage of width 16 on 4x4 patches (8x8 then 4x4 grids), 2 steps of 8 mosaics,
    evaluated on 16: the compile dominates, so the model is as small as still has two pyramid levels."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo_swin_seg", ROOT / "configs" / "demo_swin_seg.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return apply_overrides(module.get_config(), {
        "data.data_dir": data_dir, "model.variant": "Swin-16-1-1", "model.patch_size": 4, "total_epochs": 0.0,
        "total_steps": 2, "batch_size": 8, "log_every_steps": 1, "optimizer.warmup_epochs": 0.0,
        "optimizer.warmup_steps": 1, "eval.every_epochs": 0.0, "eval.every_steps": 2, "eval.batch_size": 16,
        "data.eval_split": "test[:16]", "checkpoint.every_epochs": 0.0, "checkpoint.every_steps": 1})


@pytest.fixture(scope="module")
def run(tmp_path_factory, mosaic_data_dir):
    workdir = str(tmp_path_factory.mktemp("swin_seg"))
    trainer = Trainer(tiny_config(mosaic_data_dir), workdir)
    return workdir, trainer.train(), trainer


def test_a_tiny_swin_segments_two_steps_with_logits_of_the_masks_shape(run, mosaic_data_dir):
    workdir, summary, trainer = run
    assert summary["status"] == "finished" and summary["steps"] == 2
    assert summary["model"]["family"] == "Swin" and summary["compute"]["train_flops_per_image"] > 0
    final = json.loads(open(f"{workdir}/summary.json").read())["final"]
    assert final["eval/count"] == 16 and 0.0 <= final["eval/miou"] <= 1.0 and np.isfinite(final["eval/loss"])
    rows = [json.loads(line) for line in open(f"{workdir}/metrics.jsonl")]
    first = next(r["train/loss"] for r in rows if "train/loss" in r)
    assert first == pytest.approx(np.log(11), rel=1e-4)  # the zero-initialised pixel classifier: uniform logits
    shapes = trainer.program.objective.model.shapes  # the dense model's parameters: the backbone and head/
    cfg, params = load_params_from_run(workdir, shapes)  # a Swin run
    assert isinstance(cfg, SwinConfig) and cfg.name == "Swin-16-1-1" and "lateral1" in params["head"]
    from vit_jax.data import datasets, pp

    source = datasets.open_dataset("digits_mosaic", data_dir=mosaic_data_dir, prepare=False).source("test")
    decode = pp.build("decode|decode_mask|value_range(-1,1)")
    examples = [decode(dict(source[i]), np.random.default_rng(0)) for i in range(3)]
    masks = np.stack([e["segmentation"] for e in examples])
    # Shapes only (the trained step already ran the model): no second compile of the forward pass.
    logits, _ = jax.eval_shape(trainer.program.objective.model.apply, params, np.stack([e["image"] for e in examples]))
    assert logits.shape == (*masks.shape, 11)  # one logit per class at every labelled pixel


def test_resumed_from_its_step_1_checkpoint_it_ends_bit_identical(run, tmp_path, mosaic_data_dir):
    full, _, _ = run
    workdir = str(tmp_path / "resumed")
    shutil.copytree(full, workdir)
    shutil.rmtree(f"{workdir}/checkpoints/2")  # as if stopped right after the step-1 checkpoint
    trainer = Trainer(tiny_config(mosaic_data_dir), workdir)
    assert trainer.start_step == 1
    trainer.train()
    shapes = trainer.program.objective.model.shapes
    (_, resumed), (_, reference) = load_params_from_run(workdir, shapes), load_params_from_run(full, shapes)
    assert "lateral0" in resumed["head"]
    assert jax.tree.all(jax.tree.map(np.array_equal, resumed, reference))


def test_the_oxford_pets_config_takes_a_swin_variant():
    from vit_jax.train.config import model_config, validate
    from vit_jax.train.objectives.segmentation import Segmentation

    spec_path = ROOT / "configs" / "seg_oxford_pets.py"
    import importlib.util

    spec = importlib.util.spec_from_file_location("seg_oxford_pets", spec_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config("variant=Swin-T")
    validate(c)
    cfg = model_config(c, 0)
    assert isinstance(cfg, SwinConfig) and cfg.name == "Swin-T" and cfg.window_size == 7
    objective = Segmentation.from_config(c, cfg)  # abstract: the dense Swin-T's shapes, not its weights
    head = objective.model.shapes["head"]
    assert head["lateral3"]["kernel"].shape == (768, 96) and head["pixels"]["classifier"]["kernel"].shape == (96, 48)
    assert objective.flops.breakdown["pyramid_head"] > 0
