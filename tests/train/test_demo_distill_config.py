"""configs/demo_distill.py: its three stages validate, the students read the 5% split it counts on, the student is
the smaller model, and the label-only student trains for the distilled student's FLOPs (the teacher's forward
included): the comparison's premise. Its numbers: docs/distillation.md (benchmarks/demo_distill.sh)."""

import importlib.util

import pytest

from tests.conftest import ROOT
from vit_jax.data import pipeline
from vit_jax.models.build import model_flops
from vit_jax.train.config import model_config
from vit_jax.train.objectives.distillation import distill_config
from vit_jax.train.stages import stage_configs


def load(arg=None):
    spec = importlib.util.spec_from_file_location("demo_distill", ROOT / "configs" / "demo_distill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.get_config(arg)


def test_the_stages_and_the_equal_compute_control(digits_data_dir):
    module, c = load("seed=2")
    stages = dict(stage_configs(c, "/runs/kd"))
    assert list(stages) == ["teacher", "distilled", "labels_only"]
    teacher, distilled, labels = stages["teacher"], stages["distilled"], stages["labels_only"]
    assert teacher.seed == distilled.seed == labels.seed == 2
    assert (teacher.objective, distilled.objective, labels.objective) == (
        "classification", "distillation", "classification")
    d = distill_config(distilled)
    assert (d.teacher, d.mode, d.alpha) == ("/runs/kd/teacher", "function_matching", 1.0)
    assert teacher.data.train_split == "train"
    assert distilled.data.train_split == labels.data.train_split == "train[:5%]"
    # one recipe for both students but the target: same model, data, augmentation, optimizer and batch
    for key in ("model", "data", "optimizer", "batch_size", "loss"):
        assert distilled[key].to_dict() == labels[key].to_dict() if hasattr(distilled[key], "to_dict") else (
            distilled[key] == labels[key]), key
    assert distilled.loss.mixup_alpha > 0 and distilled.loss.cutmix_alpha > 0

    digits = pipeline.open_dataset("digits", data_dir=digits_data_dir, prepare=False)
    assert digits.num_examples("train") == module.TRAIN_EXAMPLES
    assert digits.num_examples("train[:5%]") == module.LABELLED_EXAMPLES

    student = model_flops(model_config(distilled, module.NUM_CLASSES))
    teacher_fwd = model_flops(model_config(teacher, module.NUM_CLASSES)).forward
    assert teacher_fwd > 1.5 * student.forward  # the student is the smaller model
    spent = distilled.total_epochs * (student.train + teacher_fwd)
    assert labels.total_epochs * student.train == pytest.approx(spent, rel=1e-3)
    assert dict(c.stage_results) == {"distilled_top1": "distilled:eval/top1",
                                     "labels_only_top1": "labels_only:eval/top1", "teacher_top1": "teacher:eval/top1"}
