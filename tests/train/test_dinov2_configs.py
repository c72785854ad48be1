"""configs/dinov2.py: DINOv2's ViT-S/B/L/g recipes validate and build abstractly (the dino objective's model, shapes
only: nothing is initialised), their encoders have the parameters of timm's vit_*_patch14_dinov2 (counted on
PyTorch's meta device), and bad arguments fail with one line."""

import math

import jax
import numpy as np
import pytest

from tests.interop import require_timm
from tests.train.helpers import ROOT
from vit_jax.errors import ConfigError
from vit_jax.train.config import config_module, model_config, validate
from vit_jax.train.objectives import objective_class

TIMM = {"S": "vit_small_patch14_dinov2", "B": "vit_base_patch14_dinov2", "L": "vit_large_patch14_dinov2",
        "g": "vit_giant_patch14_reg4_dinov2"}
HEADS = ("dino_head", "ibot_head", "mask_token")


def load(arg):
    return config_module(ROOT / "configs" / "dinov2.py").get_config(arg)


def build(c):
    validate(c)
    cls = objective_class(c.objective)
    return cls.from_config(c, model_config(c, num_classes=cls.head_classes(c, 1)))


def encoder_params(objective) -> int:
    shapes = {k: v for k, v in objective.model.shapes.items() if k not in HEADS}
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(shapes)))


@pytest.mark.parametrize("variant", ["S", "B", "L", "g"])
def test_each_size_validates_builds_and_matches_timms_encoder(variant):
    arg = f"variant={variant}" + (",data=i21k,registers=4" if variant == "g" else "")
    c = load(arg)
    objective = build(c)
    cfg = objective.model.cfg
    assert (cfg.patch_size, cfg.layer_scale, cfg.posemb_resize, cfg.gelu) == ((14, 14), 1e-5, "dinov2", "erf")
    assert (c.objective, c.dino.koleo_weight, c.dino.ibot_weight, c.optimizer.grad_clip_norm) == ("dino", 0.1, 1.0, 3.0)
    if variant == "g":  # vitg14.yaml
        assert (cfg.ffn, cfg.registers, cfg.width, cfg.depth, cfg.num_heads, cfg.mlp_dim) == ("swiglu", 4, 1536, 40,
                                                                                              24, 4096)
        assert (c.dino.prototypes, c.dino.head_bottleneck, c.dino.separate_ibot_head, c.dino.centering) == (
            131_072, 384, True, "sinkhorn_knopp")
        assert (c.batch_size, c.total_epochs, c.model.drop_path, c.dino.momentum_start) == (3072, 500, 0.4, 0.994)
        assert c.optimizer.lr == pytest.approx(2e-4 * math.sqrt(3)) and c.data.name == "imagenet21k/fall11"
    else:  # ssl_default_config.yaml
        assert (cfg.ffn, cfg.registers, c.dino.prototypes, c.dino.separate_ibot_head) == ("mlp", 0, 65_536, False)
        assert (c.batch_size, c.optimizer.lr, c.total_epochs, c.model.drop_path) == (1024, 4e-3, 100, 0.3)
        assert c.data.name == "imagenet2012"
    timm = require_timm()
    import torch

    with torch.device("meta"):
        reference = timm.create_model(TIMM[variant], pretrained=False, img_size=224)
    # Ours keeps a class row in the position table that timm's register models lack (no_embed_class).
    expected = sum(p.numel() for p in reference.parameters()) + (cfg.width if cfg.registers else 0)
    assert encoder_params(objective) == expected


def test_registers_batch_and_epochs_arguments_and_one_line_errors():
    c = load("variant=S,registers=4,batch=4096,epochs=50")
    assert (c.model.registers, c.batch_size, c.total_epochs) == (4, 4096, 50)
    assert c.optimizer.lr == pytest.approx(4e-3 * 2) and c.optimizer.warmup_epochs == 5  # sqrt rule; warmup 10%
    assert c.dino.teacher_temp_warmup == pytest.approx(30 / 100)  # 30 of DINOv2's 100 epochs, as a fraction
    for arg, match in (("variant=H", "variant=H"), ("data=coco", "data=coco")):
        with pytest.raises(ConfigError, match=match):
            load(arg)
