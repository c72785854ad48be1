"""configs/vit_mae.py: the MAE paper's pretraining recipe, valid for ViT-B/L/H, and a model MAE can pretrain."""

import importlib.util

import pytest

from tests.train.helpers import ROOT
from vit_jax.models.mae import MAEConfig, check_encoder
from vit_jax.train.config import model_config, validate
from vit_jax.train.objectives import mae_config


def load_config(arg):
    spec = importlib.util.spec_from_file_location("vit_mae", ROOT / "configs" / "vit_mae.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


@pytest.mark.parametrize("variant,width,patch", [("B/16", 768, 16), ("L/16", 1024, 16), ("H/14", 1280, 14)])
def test_mae_recipe_validates_for_b_l_h(variant, width, patch):
    c = load_config(f"variant={variant}")
    validate(c)
    m = model_config(c, num_classes=0)
    check_encoder(m)  # a plain ViT with a class token: pretrainable by MAE
    assert (m.width, m.patch_size, m.num_classes) == (width, (patch, patch), 0)
    assert mae_config(c) == MAEConfig()  # the paper's decoder (512 wide, 8 deep, 16 heads), mask 75%, norm-pix loss
    o = c.optimizer
    assert (c.objective, o.name, o.b1, o.b2, o.weight_decay, o.schedule, o.warmup_epochs, c.total_epochs) == (
        "mae", "adamw", 0.9, 0.95, 0.05, "cosine", 40.0, 800.0)
    assert o.lr == pytest.approx(1.5e-4 * 4096 / 256)
    assert tuple(c.eval.evaluators) == ("reconstruction", "fewshot")


def test_mae_lr_follows_the_batch_size():
    c = load_config("variant=B/16,batch=1024,epochs=1600")
    assert (c.optimizer.lr, c.total_epochs) == (pytest.approx(6e-4), 1600.0)
