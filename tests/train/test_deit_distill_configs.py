"""configs/deit.py and configs/distill.py: they validate, describe the models their papers name, carry the recipes'
values, and refuse what they cannot run (no teacher, a batch the copies do not divide)."""

import importlib.util

import pytest

from tests.train.helpers import ROOT
from vit_jax.models.build import build_model
from vit_jax.train.config import ConfigError, model_config, validate
from vit_jax.train.objectives.distillation import distill_config


def load(name, arg=None):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


@pytest.mark.parametrize("variant,width,heads,params", [("Ti", 192, 3, 5.7e6), ("S", 384, 6, 22.1e6),
                                                         ("B", 768, 12, 86.6e6)])
def test_deit_variants(variant, width, heads, params):
    c = load("deit", f"variant={variant}")
    validate(c)
    m = model_config(c, num_classes=1000)
    assert (m.width, m.num_heads, m.depth, m.mlp_dim, m.patch_size) == (width, heads, 12, 4 * width, (16, 16))
    # DeiT's Table 1 parameter counts: 5M / 22M / 86M
    assert build_model(m).num_params() == pytest.approx(params, rel=0.02)


def test_deit_recipe_is_table_9():
    c = load("deit")
    o = c.optimizer
    assert (c.total_epochs, o.name, o.weight_decay, o.warmup_epochs, o.schedule, o.grad_clip_norm) == (
        300.0, "adamw", 0.05, 5.0, "cosine", 0.0)
    assert o.lr == pytest.approx(5e-4 * c.batch_size / 512) and c.batch_size % 3 == 0 and c.batch_size % 8 == 0
    assert (c.loss.label_smoothing, c.loss.mixup_alpha, c.loss.cutmix_alpha, c.loss.cutmix_switch_prob) == (
        0.1, 0.8, 1.0, 0.5)
    assert (c.data.repeated_augmentation, c.model.drop_path, c.model.dropout) == (3, 0.1, 0.0)
    assert "randaug(2,9)" in c.data.pp_train and c.objective == "classification"
    assert c.data.pp_train.endswith("value_range(-1,1)|random_erasing(0.25)")


def test_deit_distilled():
    c = load("deit", "variant=B,distill=hard,teacher=/ckpt/regnet.safetensors")
    validate(c)
    d = distill_config(c)
    assert (c.model.distilled, c.objective, d.mode, d.alpha, d.teacher) == (
        True, "distillation", "hard", 0.5, "/ckpt/regnet.safetensors")
    soft = distill_config(load("deit", "distill=soft,teacher=t.npz"))
    assert (soft.temperature, soft.alpha) == (3.0, 0.1)
    with pytest.raises(ConfigError, match="needs distill.teacher"):
        validate(load("deit", "distill=hard"))
    with pytest.raises(ValueError, match="Ti, S or B"):
        load("deit", "variant=L")


def test_distill_is_big_vision_function_matching():
    c = load("distill", "teacher=/ckpt/BiT-M-R152x2.npz")
    validate(c)
    d = distill_config(c)
    assert (d.mode, d.temperature, d.alpha, d.teacher_image_size) == ("function_matching", 1.0, 1.0, 224)
    assert (c.batch_size, c.total_epochs, c.loss.mixup_alpha, c.data.train_split) == (4096, 1200.0, 1.0,
                                                                                    "train[:98%]")
    o = c.optimizer
    assert (o.grad_clip_norm, o.warmup_steps, o.schedule, o.mu_dtype) == (1.0, 5000, "cosine", "bfloat16")
    student = model_config(c, num_classes=1000)
    assert (student.width, student.depth, student.pool) == (384, 12, "gap")
    assert model_config(load("distill", "teacher=t.npz,student=Ti/16"), 1000).width == 192
    with pytest.raises(ConfigError, match="needs distill.teacher"):
        validate(load("distill"))


def test_repeats_must_divide_the_batch():
    c = load("deit")
    c.batch_size = 1024
    with pytest.raises(ConfigError, match="does not divide batch_size=1024"):
        validate(c)
