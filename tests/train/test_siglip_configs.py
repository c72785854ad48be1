"""configs/siglip.py and configs/lit.py: the SigLIP paper's B/16 recipe and LiT's locked tower validate and build
(abstract shapes only: nothing is initialised or read), and their arguments fail with one clear line."""

import pytest

from tests.interop import require_timm
from tests.train.helpers import ROOT
from vit_jax.errors import ConfigError
from vit_jax.train.config import config_module, model_config, validate
from vit_jax.train.objectives import objective_class

DATA = "dataset=my_pairs:1.0.0,caption=text,tokenizer=/models/c4_en.model"


def load(name, arg=None):
    return config_module(ROOT / "configs" / f"{name}.py").get_config(arg)


def build(c):
    """The objective the trainer builds from the config (its model's abstract parameter shapes)."""
    validate(c)
    cls = objective_class(c.objective)
    return cls.from_config(c, model_config(c, num_classes=cls.head_classes(c, 1)))


def text_tower_params(vocab=32_000, length=64, width=768, depth=12, mlp=3072, out=768):
    """big_vision's text tower counted by hand: embeddings, pre-LN blocks, final LayerNorm, head."""
    block = 4 * (width * width + width) + 2 * width * mlp + mlp + width + 4 * width
    return vocab * width + length * width + depth * block + 2 * width + width * out + out


@pytest.fixture(scope="module")
def siglip():
    c = load("siglip", DATA)
    return c, build(c)


def test_siglip_is_the_papers_b16_recipe(siglip):
    c, objective = siglip
    o = c.optimizer
    assert (c.objective, c.batch_size, o.name, o.lr, o.weight_decay, o.b2, o.schedule) == (
        "siglip", 32_768, "adamw", 1e-3, 1e-4, 0.95, "cosine")
    assert (c.model.variant, c.model.image_size, c.model.pool, c.siglip.chunked, c.total_examples) == (
        "B/16", 224, "map", True, 9_000_000_000)
    assert (c.data.name, c.data.eval_split) == ("my_pairs:1.0.0", "validation")
    assert "tokenize('/models/c4_en.model', 64, key='text', pad_id=1)" in c.data.pp_train
    shapes = objective.model.shapes
    assert shapes["t"].shape == shapes["b"].shape == (1,)
    assert shapes["txt"]["embedding"].shape == (32_000, 768) and shapes["img_proj"]["kernel"].shape == (768, 768)

    # The image tower is timm's SigLIP B/16 (MAP head, no class token), counted by timm on PyTorch's meta device.
    timm = require_timm()
    import torch

    with torch.device("meta"):
        reference = timm.create_model("vit_base_patch16_siglip_224", pretrained=False, num_classes=0)
    image = sum(p.numel() for p in reference.parameters())
    count = objective.model.num_params()
    assert count == image + (768 * 768 + 768) + text_tower_params() + 2  # + img_proj, txt, t, b
    assert 203e6 < count < 204.5e6  # SigLIP B/16 at 224 px: ~203M parameters in all


def test_siglip_plans_without_data(siglip):
    """No dataset: the config still validates, and describes the same run (the planner needs no data)."""
    c = load("siglip")
    validate(c)
    assert c.data.name == ""
    assert (c.model.to_dict(), c.siglip.to_dict(), c.optimizer.to_dict()) == (
        siglip[0].model.to_dict(), {**siglip[0].siglip.to_dict(), "tokenizer": ""}, siglip[0].optimizer.to_dict())


def test_lit_locks_the_checkpoints_tower():
    c = load("lit", f"ckpt=/runs/vit_b16.npz,{DATA}")
    objective = build(c)
    assert (c.siglip.lock_image, c.model.pool, c.model.variant, c.optimizer.lr) == (
        "/runs/vit_b16.npz", "token", "B/16", 1e-3)
    assert "img" not in objective.model.shapes  # the tower is extra state, loaded by init_extra, never trained
    assert objective.image_model.cfg.pool == "token" and "head" not in objective.image_model.shapes
    assert 85.7e6 < objective.image_model.num_params() < 85.9e6  # ViT-B/16 without its classification head
    assert objective.flops.frozen_forward > 0  # the locked tower's forward, counted once


@pytest.mark.parametrize("name,arg,match", [
    ("siglip", "dataset=COCO Captions", "is not a TFDS dataset name"),
    ("siglip", "dataset=coco_captions", "needs tokenizer=PATH"),
    ("siglip", "dataset=coco_captions,tokenizer=x.model,caption=a b", "caption string feature"),
    ("siglip", "datset=coco_captions", "did you mean 'dataset'"),
    ("lit", None, "needs ckpt=PATH"),
    ("lit", "ckpt=x.npz,pool=cls", "pooling, one of token, gap, map"),
    ("lit", "ckpt=x.npz,dataset=my_pairs", "lit.py:dataset=my_pairs needs tokenizer=PATH"),
])
def test_bad_arguments_are_one_line(name, arg, match):
    with pytest.raises(ConfigError, match=match):
        load(name, arg)
