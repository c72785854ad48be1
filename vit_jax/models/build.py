"""One seam between the model families and their users: build, describe and count any registered family's model.

Checkpoint loaders return a config of some family with the parameters; predict, eval, convert and the trainer call
`build_model(cfg)` and get the same functional interface (init / apply / shapes / logical_axes). Importing this module
registers the built-in families (models/family.py is the registry; each family's own module registers it).
"""

from __future__ import annotations

from typing import Any

# noqa: F401 below: importing them registers the built-in families
from vit_jax.models import bit_family, swin_family, video_family, vit_family  # noqa: F401
from vit_jax.models.family import FAMILIES, Family, family_for_variant, family_of, from_meta, model_config, schema
from vit_jax.models.flops import Flops
from vit_jax.models.vit import FunctionalViT

ModelConfig = Any  # the config dataclass of any registered model family

__all__ = ["FAMILIES", "Family", "ModelConfig", "build_model", "describe", "family_for_variant", "family_of",
           "from_meta", "model_config", "model_flops", "schema"]


def build_model(cfg: ModelConfig) -> FunctionalViT:
    """The functional model (init, apply, shapes, logical_axes) of any model family's config."""
    return FunctionalViT(cfg, family_of(cfg).module)


def describe(cfg: ModelConfig) -> str:
    """One line naming a model and the settings that tell models apart (printed by the commands that load one)."""
    return family_of(cfg).describe(cfg)


def model_flops(cfg: ModelConfig) -> Flops:
    """Analytic forward FLOPs per example of any model family's config."""
    return family_of(cfg).flops(cfg)
