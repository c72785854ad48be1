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


def describe(cfg: ModelConfig) -> str:
    """One line naming a model and the settings that tell models apart (printed by the commands that load one)."""
    if isinstance(cfg, BiTConfig):
        return (f"{cfg.name} (units {cfg.layers}, width factor {cfg.width_factor}, classes={cfg.num_classes}, "
                f"image={cfg.image_size[0]}x{cfg.image_size[1]})")
    extra = [f"pool={cfg.pool}", f"posemb={cfg.posemb}", f"classes={cfg.num_classes}",
             f"image={cfg.image_size[0]}x{cfg.image_size[1]}"]
    if cfg.rep_size:
        extra.append(f"pre-logits={cfg.rep_size}")
    if cfg.resnet_layers:
        extra.append(f"resnet={cfg.resnet_layers}x{cfg.resnet_width}")
    if cfg.window_size:
        extra.append(f"window={cfg.window_size} global_blocks={cfg.global_blocks}")
    extra += [name for name, on in (("rel_pos", cfg.rel_pos), ("dense", cfg.dense),
                                    (f"neck={cfg.neck_dim}", cfg.neck_dim)) if on]
    return (f"{cfg.name} (width {cfg.width}, depth {cfg.depth}, heads {cfg.num_heads}, mlp {cfg.mlp_dim}, "
            f"patch {cfg.patch_size[0]}x{cfg.patch_size[1]}, {', '.join(extra)})")
