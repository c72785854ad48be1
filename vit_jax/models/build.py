"""One seam between a model family and its users: `build_model(cfg)` picks the family from the config's type.

Checkpoint loaders return a config (ViTConfig or BiTConfig) with the parameters; predict, eval, convert and the trainer
call `build_model(cfg)` and get the same functional interface (init / apply / shapes / logical_axes) for either.
"""

from __future__ import annotations

from vit_jax.models.bit import BiT
from vit_jax.models.bit_config import BiTConfig
from vit_jax.models.config import ViTConfig
from vit_jax.models.vit import FunctionalViT, ViT

ModelConfig = ViTConfig | BiTConfig

_FAMILIES = {ViTConfig: ViT, BiTConfig: BiT}


def build_model(cfg: ModelConfig) -> FunctionalViT:
    """The functional model (init, apply, shapes, logical_axes) of any model family's config."""
    try:
        module = _FAMILIES[type(cfg)]
    except KeyError:
        raise TypeError(f"no model family for config type {type(cfg).__name__}") from None
    return FunctionalViT(cfg, module)
