"""The one trainer trains BiT ResNets: a tiny one by name for two steps, in-process, checkpoint readable anywhere."""

import json

import numpy as np
import pytest

from tests.train.helpers import demo_config
from vit_jax.checkpoints.loading import load_any
from vit_jax.models.bit_config import BiTConfig
from vit_jax.train.config import ConfigError, default_config, model_config
from vit_jax.train.trainer import Trainer

# configs/demo.py's ViT sizes back at their defaults, and a BiT of two one-unit stages instead.
BIT = {"model.variant": "BiT-R1-1x1", "model.width": 0, "model.depth": 0, "model.mlp_dim": 0, "model.num_heads": 0,
       "model.patch_size": 0, "model.pool": "token"}


def test_two_training_steps_of_a_tiny_bit(tmp_path, digits_data_dir):
    workdir = str(tmp_path / "bit")
    c = demo_config(digits_data_dir, **BIT, total_steps=2, batch_size=16, **{"checkpoint.every_steps": 2})
    summary = Trainer(c, workdir).train()
    assert summary["steps"] == 2 and np.isfinite(summary["final"]["eval/loss"])
    assert summary["model"]["family"] == "ResNet" and summary["compute"]["train_flops_per_image"] > 0
    first = json.loads(open(f"{workdir}/metrics.jsonl").readline())
    assert first["train/loss"] == pytest.approx(np.log(10), abs=1e-5)  # the zero-initialised head: uniform logits
    cfg, params = load_any(workdir)  # a BiT run reads back as a BiT
    assert isinstance(cfg, BiTConfig) and cfg.name == "BiT-R1-1x1" and cfg.num_classes == 10
    assert params["head"]["kernel"].shape == (512, 10) and np.abs(params["head"]["kernel"]).max() > 0  # trained

    # Fine-tuning with the architecture from init.checkpoint alone (model.variant empty), a fresh head whose bias
    # starts at -10 (the sigmoid-loss setting of ImageNet-21k pretraining): the first loss is the sum over the 10
    # classes of softplus(-10) - (-10) * label, with the labels summing to 1 (smoothed or not).
    tuned = str(tmp_path / "tuned")
    c = demo_config(digits_data_dir, **{**BIT, "model.variant": ""}, total_steps=1, batch_size=16,
                    **{"init.checkpoint": workdir, "loss.kind": "sigmoid_xent", "model.head_bias_init": -10.0})
    summary = Trainer(c, tuned).train()
    assert summary["model"]["family"] == "ResNet"
    first = json.loads(open(f"{tuned}/metrics.jsonl").readline())
    assert first["train/loss"] == pytest.approx(10 * np.log1p(np.exp(-10.0)) + 10.0, abs=1e-4)
    cfg, tuned_params = load_any(tuned)
    assert (cfg.name, cfg.num_classes, cfg.gn_eps) == ("BiT-R1-1x1", 10, BiTConfig.gn_eps)
    assert tuned_params["conv_root"]["kernel"].shape == params["conv_root"]["kernel"].shape


def test_vit_options_on_a_bit_are_a_config_error():
    c = default_config()
    c.model.variant, c.model.drop_path = "BiT-R50x1", 0.1
    with pytest.raises(ConfigError, match=r"BiT model, which has no model.drop_path"):
        model_config(c, 10)
    c.model.drop_path = 0.0
    assert model_config(c, 10).name == "BiT-R50x1"
    # The same check when the ResNet comes from init.checkpoint (model.variant empty).
    c.model.variant, c.model.drop_path = "", 0.1
    with pytest.raises(ConfigError, match=r"init.checkpoint \(BiT-R50x1\) is a BiT model, which has no model.drop_path"):
        model_config(c, 10, architecture=BiTConfig())
    c.model.drop_path = 0.0
    assert model_config(c, 7, architecture=BiTConfig()) == BiTConfig(num_classes=7)
