"""Multi-stage runs (train/stages.py): stage configs validated up front, stages run in order in their own folders,
an earlier stage as a later one's init, the recipe's summary, and a rerun that skips finished stages."""

import json

import pytest

from tests.train.helpers import demo_config
from vit_jax.train.config import ConfigError
from vit_jax.train.stages import run_stages, stage_configs
from vit_jax.train.trainer import Trainer

TINY = {"model.width": 32, "model.depth": 1, "model.mlp_dim": 64, "model.num_heads": 2, "total_steps": 3}
PRETRAIN = {"objective": "mae", "eval.evaluators": ("reconstruction",), "loss.label_smoothing": 0.0,
            "mae.decoder_width": 32, "mae.decoder_depth": 1, "mae.decoder_heads": 2, "mae.decoder_mlp_dim": 64}


def recipe(data_dir):
    c = demo_config(data_dir, **TINY)
    c.stages = (("pretrain", PRETRAIN),
                ("finetune", {"init.checkpoint": "{workdir}/pretrain", "data.train_split": "train[:10%]"}),
                ("scratch", {"data.train_split": "train[:10%]", "total_steps": 5}))
    c.stage_results = (("ssl_top1", "finetune:eval/top1"), ("scratch_top1", "scratch:eval/top1"))
    return c


def test_every_stage_is_validated_before_any_trains_and_errors_name_the_stage(digits_data_dir):
    c = recipe(digits_data_dir)
    configs = stage_configs(c, "/runs/r")
    assert [name for name, _ in configs] == ["pretrain", "finetune", "scratch"]
    pre, ft, scratch = (cfg for _, cfg in configs)
    assert pre.objective == "mae" and ft.objective == "classification" and not pre.stages
    assert ft.init.checkpoint == "/runs/r/pretrain" and ft.data.train_split == "train[:10%]"
    assert scratch.total_steps == 5 and pre.total_steps == 3 and scratch.model.width == 32

    c.stages = c.stages[:2] + (("scratch", {"optimizer.lrr": 0.1}),)
    with pytest.raises(ConfigError, match=r"stage 'scratch': unknown config key 'optimizer.lrr'; did you mean "
                                          r"'optimizer.lr'\?"):
        stage_configs(c, "/runs/r")
    c.stages = c.stages[:2] + (("scratch", {"optimizer.lr": "high"}),)
    with pytest.raises(ConfigError, match=r"stage 'scratch': config key 'optimizer.lr' must be float"):
        stage_configs(c, "/runs/r")
    c.stages = (("a", {}), ("a", {}))
    with pytest.raises(ConfigError, match="distinct folder names"):
        stage_configs(c, "/runs/r")
    c.stages = (("a", {}),)
    c.stage_results = (("top1", "b:eval/top1"),)
    with pytest.raises(ConfigError, match=r"stage_results.top1='b:eval/top1': name a stage's final metric"):
        stage_configs(c, "/runs/r")


def test_a_config_with_stages_is_not_one_trainers_run(digits_data_dir, tmp_path):
    with pytest.raises(ConfigError, match="this config has stages"):
        Trainer(recipe(digits_data_dir), str(tmp_path))


def test_stages_run_in_order_the_later_from_the_earlier_and_a_rerun_skips_finished_ones(digits_data_dir, tmp_path):
    calls = []

    def train(config, workdir):
        calls.append(workdir.rsplit("/", 1)[1])
        return Trainer(config, workdir).train()

    def two_stages():
        # Supervised "pretraining" here: the same program as the fine-tune (one compile in the session); starting a
        # fine-tune from an MAE run is tests/train/test_mae_training.py's. The third stage would only cost time.
        c = recipe(digits_data_dir)
        c.stages = (("pretrain", {"loss.label_smoothing": 0.0}), c.stages[1])
        c.stage_results = c.stage_results[:1]
        return c

    workdir = str(tmp_path / "recipe")
    summary = run_stages(two_stages(), workdir, train)
    assert calls == ["pretrain", "finetune"]
    on_disk = json.loads((tmp_path / "recipe" / "summary.json").read_text())
    assert on_disk["status"] == "finished" and set(on_disk["stages"]) == {"pretrain", "finetune"}
    stages = on_disk["stages"]
    assert on_disk["ssl_top1"] == stages["finetune"]["final"]["eval/top1"] == summary["ssl_top1"]
    assert stages["pretrain"]["dataset"]["train_examples"] == 1437 and stages["finetune"]["steps"] == 3
    assert stages["finetune"]["dataset"]["train_examples"] == 144  # 10% of the 1,437 training images
    finetune_log = (tmp_path / "recipe" / "finetune" / "summary.json").read_text()
    assert json.loads(finetune_log)["config"]["init"]["checkpoint"] == f"{workdir}/pretrain"

    calls.clear()
    again = run_stages(two_stages(), workdir, train)
    assert calls == [] and again["ssl_top1"] == on_disk["ssl_top1"]
