"""Every shipped config builds and validates with its documented arguments; bad arguments are clear errors."""

import importlib.util

import pytest

from tests.train.helpers import ROOT
from vit_jax.models.config import vit_config
from vit_jax.train.config import ConfigError, model_config, validate


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name,arg,expect", [
    ("demo", None, dict(batch_size=128)),
    ("vit_i21k", "variant=B/16", dict(batch_size=4096, total_epochs=90.0)),
    ("vit_i21k", "variant=L/16,epochs=30", dict(total_epochs=30.0)),
    ("vit_i21k", "variant=H/14,loss=softmax", dict(total_epochs=90.0)),
    ("finetune", "dataset=imagenet2012,init=x.npz", dict(batch_size=512, total_steps=20_000)),
    ("finetune", "dataset=cifar10", dict(total_steps=10_000)),
    ("finetune", "dataset=oxford_flowers102,lr=0.003", dict(total_steps=500)),
    ("finetune", "dataset=digits,steps=50,resolution=32", dict(total_steps=50)),
    ("finetune", "dataset=folder:/photos,variant=B/16", dict(total_steps=500)),
    ("vit_i1k", "variant=B/16,preset=paper", dict(batch_size=4096, total_epochs=300.0)),
    ("vit_i1k", "preset=beyer2022", dict(batch_size=1024, total_epochs=90.0)),
    ("vit_mpp", None, dict(batch_size=4096, total_steps=1_000_000)),
    ("vit_mpp", "dataset=imagenet2012,steps=100000,target=color_4x4_3bit", dict(total_steps=100_000)),
])
def test_configs_validate(name, arg, expect):
    c = load(name).get_config(arg)
    validate(c)
    for k, v in expect.items():
        assert c[k] == v, k
    # The model it describes can be built (fine-tuning configs without a variant take it from init.checkpoint).
    model_config(c, num_classes=10, architecture=None if c.model.variant or name != "finetune" else vit_config("B/16"))


def test_paper_recipes():
    i21k = load("vit_i21k").get_config("variant=B/16")
    assert (i21k.optimizer.lr, i21k.optimizer.weight_decay, i21k.optimizer.warmup_steps, i21k.optimizer.schedule,
            i21k.model.dropout, i21k.model.rep_size, i21k.model.head_bias_init, i21k.loss.kind) == (
        1e-3, 0.03, 10_000, "linear", 0.1, 768, -10.0, "sigmoid_xent")
    ft = load("finetune").get_config("dataset=cifar100")
    assert (ft.optimizer.name, ft.optimizer.momentum, ft.optimizer.weight_decay, ft.optimizer.grad_clip_norm,
            ft.model.image_size, ft.model.rep_size, tuple(ft.init.reinit)) == ("sgd", 0.9, 0.0, 1.0, 384, 0, ("head",))
    beyer = load("vit_i1k").get_config("preset=beyer2022")
    assert (beyer.model.pool, beyer.model.posemb, beyer.loss.mixup_alpha) == ("gap", "sincos2d", 0.2)
    assert "randaug(2,10)" in beyer.data.pp_train
    assert (beyer.model.rep_size, beyer.optimizer.mu_dtype) == (384, "bfloat16")  # big_vision's vit_s16_i1k.py


def test_mpp_recipe_is_the_vit_papers_appendix_b12():
    from vit_jax.models.mpp import MPPConfig, check_encoder
    from vit_jax.train.objectives import mpp_config

    c = load("vit_mpp").get_config()
    assert mpp_config(c) == MPPConfig()  # 50% corrupted, 80/10/10, 3-bit mean colour
    o = c.optimizer
    assert (c.objective, c.model.variant, c.batch_size, c.total_steps, o.name, o.lr, o.warmup_steps, o.schedule) == (
        "masked_patch_prediction", "B/16", 4096, 1_000_000, "adamw", 2e-4, 10_000, "cosine")
    assert tuple(c.eval.evaluators) == ("masked_patch", "fewshot")
    check_encoder(model_config(c, num_classes=0), mpp_config(c))  # a ViT-B/16 that MPP can pretrain


def test_bad_config_arguments():
    with pytest.raises(ConfigError, match="did you mean 'variant'"):
        load("vit_i21k").get_config("varient=B/16")
    with pytest.raises(ConfigError, match="unknown config argument 'resolutoin'; did you mean 'resolution'"):
        load("finetune").get_config("dataset=cifar10,resolutoin=224")
    with pytest.raises(ConfigError, match="model.variant is empty"):  # no variant, no sizes, no init to take it from
        model_config(load("finetune").get_config("dataset=cifar10"), num_classes=10)


@pytest.mark.parametrize("name", ["demo", "vit_i21k", "finetune", "vit_i1k", "vit_mae", "bit_i21k", "vit_mpp",
                                  "siglip", "swin_i1k"])
def test_each_shipped_config_names_its_target_topology(name):
    """benchmarks/preflight_configs.py compiles every TARGETS entry for its topology (table in docs/BENCHMARKS.md)."""
    from vit_jax import hardware

    module = load(name)
    assert module.TARGETS
    for arg, topology in module.TARGETS.items():
        c = module.get_config(arg or None)
        validate(c)
        model_config(c, num_classes=10)  # a complete model (the planner has no checkpoint to take it from)
        assert f"({topology})" in module.__doc__ or f"({hardware.parse_topology(topology).name})" in module.__doc__


def test_huge_i21k_variants_are_scanned_rematerialised_and_sharded():
    g = load("vit_i21k").get_config("variant=g/14")
    assert (g.model.scan, g.model.remat, g.mesh.fsdp, g.optimizer.mu_dtype) == (True, "dots_no_batch", 8, "bfloat16")
