"""Segmentation through the one trainer: a few steps of configs/demo_seg.py (made tiny) on the generated mosaics
write eval/miou and eval/pixel_acc to summary.json; a classifier's architecture as the dense backbone (the weights'
surgery: tests/models/test_segmentation.py); config errors; the oxford_iiit_pet config builds its program."""

import importlib.util
import json

import numpy as np
import pytest

from tests.train.helpers import ROOT, apply_overrides
from vit_jax.train import config as config_lib
from vit_jax.train.config import ConfigError
from vit_jax.train.trainer import Trainer

pytestmark = pytest.mark.slow

# A clear margin: the trained mIoU must be this many times the all-background prediction's on the same mosaics.
BACKGROUND_MARGIN = 4.0


def load_config(name: str, arg=None):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def tiny_seg_config(data_dir: str, **overrides):
    """configs/demo_seg.py at width 64, depth 2, for 60 steps at a peak learning rate of 5e-3, evaluated at steps 30
    and 60 on 100 test mosaics. Fewer steps learn only the background (the most pixels): 6 steps or 40 at the demo's
    2e-3 score exactly the all-background prediction; 60 at 5e-3 reach ~57% mIoU (that prediction: 6.6%)."""
    c = load_config("demo_seg")
    return apply_overrides(c, {
        "data.data_dir": data_dir, "total_epochs": 0.0, "total_steps": 60, "batch_size": 16, "log_every_steps": 1,
        "model.width": 64, "model.depth": 2, "model.mlp_dim": 128, "model.num_heads": 2,
        "optimizer.lr": 5e-3, "optimizer.warmup_epochs": 0.0, "optimizer.warmup_steps": 1,
        "eval.every_epochs": 0.0, "eval.every_steps": 30, "eval.batch_size": 64, "checkpoint.every_epochs": 0.0,
        "data.eval_split": "test[:100]", **overrides})


def all_background_metrics(data_dir: str, split: str) -> dict:
    """mIoU and pixel accuracy of predicting background (class 0) at every pixel of `split`'s label maps: what a
    model that learned only the majority class scores on the same data."""
    from vit_jax.data import datasets, pp
    from vit_jax.eval.segmentation import metrics_from_confusion

    source = datasets.open_dataset("digits_mosaic", data_dir=data_dir, prepare=False).source(split)
    decode = pp.build("decode|decode_mask")
    confusion = np.zeros((11, 11))  # row = true class, column = predicted (all in column 0)
    for i in range(len(source)):
        labels = decode(dict(source[i]), np.random.default_rng(0))["segmentation"]
        confusion[:, 0] += np.bincount(labels.ravel(), minlength=11)
    return metrics_from_confusion(confusion)


def test_segmentation_trains_and_writes_miou_to_the_summary(tmp_path, mosaic_data_dir):
    summary = Trainer(tiny_seg_config(mosaic_data_dir), str(tmp_path / "run")).train()
    assert summary["status"] == "finished" and summary["steps"] == 60 and summary["skipped_steps"] == 0
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    final = on_disk["final"]
    assert final["eval/count"] == 100
    # The digits are learned, not only the background: an all-background prediction of the same 100 mosaics scores
    # its background fraction in pixel accuracy and ~1/11 of that in mIoU (0 IoU for every digit class).
    background = all_background_metrics(mosaic_data_dir, "test[:100]")
    assert final["eval/miou"] > BACKGROUND_MARGIN * background["miou"]
    assert final["eval/pixel_acc"] > background["pixel_acc"]
    assert on_disk["best"]["eval/miou"] >= final["eval/miou"] and on_disk["best"]["step"] in (30, 60)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "eval/miou" in r] == [30, 60]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert np.isfinite(losses).all() and losses[0] == pytest.approx(np.log(11), rel=0.05)  # zero head: uniform
    assert on_disk["compute"]["train_flops_per_image"] > 0
    # `vit-jax eval` on the run: the objective's own evaluation, the same numbers as the run's last one.
    from vit_jax.commands import eval as eval_command

    assert eval_command.main(["--checkpoint", str(tmp_path / "run"), "--output", str(tmp_path / "eval.json")]) == 0
    again = json.loads((tmp_path / "eval.json").read_text())
    assert again["eval/count"] == 100
    assert again["eval/miou"] == pytest.approx(final["eval/miou"]) and again["eval/loss"] == pytest.approx(
        final["eval/loss"], rel=1e-5)


def test_a_segmentation_config_takes_a_classifiers_architecture_as_a_dense_backbone():
    # configs/finetune.py-style: no variant, the architecture (token-pooled, not dense) comes from init.checkpoint.
    from vit_jax.models.config import vit_config

    classifier = vit_config(None, width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=4, image_size=16,
                            pool="token", num_classes=10)
    c = load_config("demo_seg")
    c = apply_overrides(c, {"init.checkpoint": "run", "model.width": 0, "model.depth": 0, "model.mlp_dim": 0,
                            "model.num_heads": 0, "model.patch_size": 0})
    cfg = config_lib.model_config(c, 0, architecture=classifier)
    assert (cfg.width, cfg.depth, cfg.patch_size, cfg.dense, cfg.pool, cfg.num_classes, cfg.image_size) == (
        64, 2, (4, 4), True, "gap", 0, (32, 32))
    # A size also set in the config (here equal to the checkpoint's) wins over the checkpoint's; it used to be passed
    # twice ("multiple values for keyword argument 'patch_size'").
    assert config_lib.model_config(apply_overrides(c, {"model.patch_size": 4}), 0, architecture=classifier) == cfg


@pytest.mark.parametrize("overrides,match", [
    ({"model.dense": False}, "set model.dense=True and segmentation.num_classes"),
    ({"segmentation.num_classes": 0}, "segmentation.num_classes"),
    ({"eval.evaluators": ("classification",)}, r"eval.evaluators=\(\"segmentation\", \"fewshot\"\)"),
    ({"objective": "classification", "eval.evaluators": ("classification",)}, "choose an objective for dense features"),
])
def test_config_errors(tmp_path, overrides, match):
    c = apply_overrides(load_config("demo_seg"), overrides)
    with pytest.raises(ConfigError, match=match):
        config_lib.validate(c)
        config_lib.model_config(c, 0)


def test_a_missing_mask_op_is_one_clear_error(tmp_path, mosaic_data_dir):
    from vit_jax.train.objectives import MissingMaskError

    c = tiny_seg_config(mosaic_data_dir, **{"data.pp_train": "decode|value_range(-1,1)", "total_steps": 1})
    with pytest.raises(MissingMaskError, match="add decode_mask"):
        Trainer(c, str(tmp_path / "run")).train()


def test_oxford_pets_config_builds_its_program():
    from vit_jax.train.program import build_program

    c = load_config("seg_oxford_pets")
    config_lib.validate(c)
    assert (c.data.name, c.segmentation.num_classes, c.objective) == ("oxford_iiit_pet", 3, "segmentation")
    assert "decode_mask('segmentation_mask', offset=-1)" in c.data.pp_train
    # The recipe at a tiny shape (the dataset cannot be downloaded here): the program compiles its steps' shapes.
    c = apply_overrides(c, {"model.variant": "", "model.width": 32, "model.depth": 2, "model.mlp_dim": 64,
                            "model.num_heads": 2, "model.patch_size": 8, "model.image_size": 32, "batch_size": 8,
                            "total_steps": 2,
                            "init.checkpoint": "", "init.required": False})
    durations = config_lib.resolve_durations(c, 3680)
    program = build_program(c, 37, durations)
    assert program.objective.num_classes == 3 and program.model.cfg.dense
    assert program.flops_per_image > 0
