"""The BiT ResNet-v2 family (the ViT paper's convolutional baseline) on the model-family registry
(models/family.py): its training-config keys, config construction, description, FLOPs and report label."""

from __future__ import annotations

from typing import Any, Mapping

from vit_jax.models import family
from vit_jax.models.bit import BiT
from vit_jax.models.bit_config import BiTConfig, bit_config, is_bit_name
from vit_jax.models.flops import bit_flops

# The model.* keys a BiT ResNet reads (the defaults are the ViT family's for the keys both read: the first family to
# name a key sets its default); its units and width come from the variant name or the init checkpoint.
SCHEMA = {"variant": "Ti/16", "image_size": 224, "dtype": "float32", "param_dtype": "float32", "remat": "none",
          "head_bias_init": 0.0}


def from_training_config(m: Mapping[str, Any], num_classes: int, architecture: BiTConfig | None = None) -> BiTConfig:
    """The BiTConfig of `model.variant` "BiT-R50x1" / "R101x3", or of the init checkpoint's BiT `architecture` (its
    units, width and epsilons) when the variant is empty; the head size comes from the dataset."""
    kw = {k: m[k] for k in SCHEMA if k != "variant"}
    if architecture is not None and not m["variant"]:
        return architecture.replace(num_classes=num_classes, **kw)
    return bit_config(m["variant"], num_classes=num_classes, **kw)


def describe(cfg: BiTConfig) -> str:
    return (f"{cfg.name} (units {cfg.layers}, width factor {cfg.width_factor}, classes={cfg.num_classes}, "
            f"image={cfg.image_size[0]}x{cfg.image_size[1]})")


BIT = family.register(family.Family(
    name="BiT", config_type=BiTConfig, module=BiT, schema=SCHEMA, owns_variant=is_bit_name,
    from_training_config=from_training_config, from_meta=lambda model: bit_config(**model), describe=describe,
    flops=bit_flops, label=lambda cfg: "ResNet"))
