"""configs/demo_ssl.py: its three stages validate, they read the splits it counts on, and the from-scratch control
trains for the FLOPs of pretraining and fine-tuning together (the comparison's premise). Its numbers: docs/ssl.md."""

import importlib.util

import pytest

from tests.conftest import ROOT
from vit_jax.data import pipeline
from vit_jax.models.build import model_flops
from vit_jax.models.flops import mae_flops
from vit_jax.models.mae import MAEConfig
from vit_jax.train.config import model_config
from vit_jax.train.stages import stage_configs


def load(arg=None):
    spec = importlib.util.spec_from_file_location("demo_ssl", ROOT / "configs" / "demo_ssl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.get_config(arg)


def test_the_stages_and_the_equal_compute_control(digits_data_dir):
    module, c = load("seed=3")
    stages = dict(stage_configs(c, "/runs/ssl"))
    assert list(stages) == ["pretrain", "finetune", "scratch"]
    pre, ft, scratch = stages["pretrain"], stages["finetune"], stages["scratch"]
    assert pre.objective == "mae" and pre.data.train_split == "train" and pre.seed == ft.seed == scratch.seed == 3
    assert ft.init.checkpoint == "/runs/ssl/pretrain" and not scratch.init.checkpoint
    assert ft.data.train_split == scratch.data.train_split == "train[:10%]"
    assert dict(c.stage_results) == {"ssl_finetune_top1": "finetune:eval/top1", "scratch_top1": "scratch:eval/top1"}

    digits = pipeline.open_dataset("digits", data_dir=digits_data_dir, prepare=False)
    assert digits.num_examples("train") == module.TRAIN_EXAMPLES
    assert digits.num_examples("train[:10%]") == module.LABELLED_EXAMPLES

    mae = mae_flops(model_config(pre, 0), MAEConfig(**pre.mae)).train
    cls = model_flops(model_config(ft, module.NUM_CLASSES)).train
    spent = pre.total_epochs * module.TRAIN_EXAMPLES * mae + ft.total_epochs * module.LABELLED_EXAMPLES * cls
    control = scratch.total_epochs * module.LABELLED_EXAMPLES * cls
    assert control == pytest.approx(spent, rel=1e-3) and scratch.total_epochs > 8 * ft.total_epochs
