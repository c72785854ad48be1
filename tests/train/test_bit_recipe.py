"""BiT's recipe: the staircase schedule, configs/bit_i21k.py, and BiT-HyperRule fine-tuning (configs/finetune.py)."""

import pytest

from tests.train.test_shipped_configs import load
from vit_jax.models.bit_config import BiTConfig
from vit_jax.train.config import ConfigError, default_config, model_config, resolve_durations, validate
from vit_jax.train.optimizer import make_schedule

I21K_TRAIN = 13_000_000  # about ImageNet-21k's size; only the step arithmetic depends on it


def test_staircase_divides_the_lr_at_fractions_of_training_after_a_linear_warmup():
    o = default_config().optimizer
    o.lr, o.schedule, o.staircase_at, o.staircase_factor = 1.0, "staircase", (0.3, 0.6, 0.9), 0.1
    f = make_schedule(o, total_steps=100, warmup_steps=10)
    lrs = {step: float(f(step)) for step in (0, 5, 10, 29, 30, 59, 60, 89, 90, 99)}
    assert lrs == pytest.approx({0: 0.0, 5: 0.5, 10: 1.0, 29: 1.0, 30: 0.1, 59: 0.1, 60: 0.01, 89: 0.01, 90: 1e-3,
                                 99: 1e-3})


@pytest.mark.parametrize("bad", [(), (0.6, 0.3), (0.3, 1.0)])
def test_staircase_needs_increasing_fractions(bad):
    c = load("bit_i21k").get_config()
    c.optimizer.staircase_at = bad
    with pytest.raises(ConfigError, match="staircase schedule needs increasing fractions"):
        validate(c)


def test_bit_i21k_is_bits_upstream_recipe():
    c = load("bit_i21k").get_config("variant=BiT-R101x3")
    validate(c)
    cfg = model_config(c, num_classes=21843)
    assert isinstance(cfg, BiTConfig) and cfg.name == "BiT-R101x3" and c.data.name == "imagenet21k/fall11"
    o = c.optimizer
    assert (o.name, o.momentum, c.batch_size, o.lr, o.warmup_steps, o.grad_clip_norm) == ("sgd", 0.9, 4096, 0.48,
                                                                                         5000, 0.0)
    # lr / 10 at epochs 30, 60 and 80 of 90.
    d = resolve_durations(c, I21K_TRAIN)
    f = make_schedule(o, d.total_steps, d.warmup_steps)
    at = {e: float(f(int(e * d.steps_per_epoch) + 1)) for e in (20, 40, 70, 85)}
    assert at == pytest.approx({20: 0.48, 40: 0.048, 70: 0.0048, 85: 0.00048})
    with pytest.raises(ConfigError, match="not a BiT ResNet"):
        load("bit_i21k").get_config("variant=B/16")


@pytest.mark.parametrize("dataset,steps,warmup,decays,precrop,crop,mixup", [
    ("oxford_flowers102", 500, 100, (0.4, 0.6, 0.8), 448, 384, 0.0),  # small: 1,020 images
    ("cifar100", 10_000, 500, (0.3, 0.6, 0.9), 160, 128, 0.1),  # medium, 32x32 images: low resolution
    ("imagenet2012", 20_000, 500, (0.3, 0.6, 0.9), 448, 384, 0.1),  # large: 1.28M images
])
def test_bit_hyperrule_by_dataset_size(dataset, steps, warmup, decays, precrop, crop, mixup):
    ft = load("finetune")
    c = ft.get_config(f"dataset={dataset},variant=BiT-R50x1,init=bit.npz,hyperrule=bit")
    validate(c)
    assert isinstance(model_config(c, num_classes=10), BiTConfig)
    o = c.optimizer
    assert (c.total_steps, o.warmup_steps, o.schedule, c.model.image_size, c.loss.mixup_alpha) == (
        steps, warmup, "staircase", crop, mixup)
    assert tuple(o.staircase_at) == pytest.approx(decays)
    assert (o.name, o.momentum, o.lr, o.weight_decay, c.batch_size) == ("sgd", 0.9, 0.003, 0.0, 512)
    assert c.data.pp_train.startswith(f"decode|resize({precrop})|random_crop({crop})|flip_lr")
    assert c.data.pp_eval == f"decode|resize({crop})|value_range(-1,1)"


def test_bit_hyperrule_of_other_datasets_needs_their_size():
    ft = load("finetune")
    with pytest.raises(ConfigError, match="give its size, e.g. train_examples="):
        ft.get_config("dataset=folder:/photos,variant=BiT-R50x1,hyperrule=bit")
    c = ft.get_config("dataset=folder:/photos,variant=BiT-R50x1,hyperrule=bit,train_examples=25000,image_px=64")
    assert (c.total_steps, c.model.image_size, c.loss.mixup_alpha) == (10_000, 128, 0.1)
    assert ft.bit_hyperrule(19_999, 96)["steps"] == 500 and ft.bit_hyperrule(500_000, 95)["crop"] == 128
