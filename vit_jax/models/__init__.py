"""The ViT model family: configuration, Flax NNX modules, parameter and FLOP accounting.

The configuration names are imported eagerly (pure Python: config files and the training-config schema use them);
the modules (`ViT`, `count_params`) on first use, so that reading a config does not import JAX and Flax.
"""

from vit_jax.models.config import ViTConfig, parse_variant, vit_config

__all__ = ["ViT", "ViTConfig", "count_params", "parse_variant", "vit_config"]


def __getattr__(name: str):
    if name in ("ViT", "count_params"):
        from vit_jax.models import vit

        return getattr(vit, name)
    raise AttributeError(f"module 'vit_jax.models' has no attribute {name!r}")
