"""The ViT model family: configuration, Flax NNX modules, parameter and FLOP accounting."""

from vit_jax.models.config import ViTConfig, parse_variant, vit_config
from vit_jax.models.vit import ViT, count_params

__all__ = ["ViT", "ViTConfig", "count_params", "parse_variant", "vit_config"]
