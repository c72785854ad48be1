"""The ViT family (and the paper's hybrids: a ViT on a BiT ResNet stem) on the model-family registry
(models/family.py): its training-config keys, config construction, description, FLOPs and report label."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

from vit_jax.errors import ConfigError
from vit_jax.models import family
from vit_jax.models.config import VARIANT_FIELDS, ViTConfig, parse_variant, vit_config
from vit_jax.models.flops import segmentation_flops, vit_flops
from vit_jax.models.segmentation import SegmentationViT
from vit_jax.models.vit import ViT

# What a checkpoint's architecture fixes, when a fine-tuning config takes its model from init.checkpoint.
ARCHITECTURE_FIELDS = ("width", "depth", "mlp_dim", "num_heads", "patch_size", "pool", "posemb", "gelu",
                       "resnet_layers", "resnet_width", "window_size", "global_blocks", "rel_pos", "dense", "neck_dim",
                       "ln_eps", "distilled", "layer_scale", "registers", "ffn")


def training_schema() -> dict[str, Any]:
    """config.model of a ViT: `variant` plus every ViTConfig field but the head size (which comes from the dataset).

    Derived from the dataclass so that the model's settings are written once (models/config.py, with their
    meaning). The fields a variant sets are 0 / () here, meaning "the variant's"; a non-zero value overrides the
    variant (custom sizes, R50+B/16 with resnet_width=2). `image_size` is one side of a square input here.
    """
    schema: dict[str, Any] = {"variant": "Ti/16"}  # any variant string of vit_jax.models; "" = sizes given below
    for field in dataclasses.fields(ViTConfig):
        if field.name == "num_classes":
            continue
        if field.name in VARIANT_FIELDS:
            schema[field.name] = () if field.name == "resnet_layers" else 0
        elif field.name == "image_size":
            schema[field.name] = field.default[0]
        else:
            schema[field.name] = field.default
    return schema


def from_training_config(m: Mapping[str, Any], num_classes: int, architecture: ViTConfig | None = None) -> ViTConfig:
    """The ViTConfig of a training config's model.* values (the head size comes from the dataset).

    `architecture` (the ViTConfig of init.checkpoint) supplies the architecture when model.variant is empty;
    sizes set in the config still override it.
    """
    # Variant fields override the variant only where set (0 / () = the variant's own value).
    overrides = {k: m[k] for k in VARIANT_FIELDS if m[k]}
    kw = {k: m[k] for k in m if k != "variant" and k not in VARIANT_FIELDS}
    if not m["variant"]:
        sizes = ("width", "depth", "mlp_dim", "num_heads")
        if architecture is None and not all(m[k] for k in sizes):
            raise ConfigError("model.variant is empty: set it (e.g. Ti/16, B/16), give width, depth, mlp_dim and "
                              "num_heads, or set init.checkpoint to take the architecture from")
        if architecture is not None:  # a dense config (segmentation) reads a classifier's encoder as a backbone
            kw.update({k: getattr(architecture, k) for k in ARCHITECTURE_FIELDS
                       if not (m["dense"] and k in ("dense", "pool"))})
    return vit_config(m["variant"] or None, num_classes=num_classes, **{**kw, **overrides})  # set sizes win


def describe(cfg: ViTConfig) -> str:
    extra = [f"pool={cfg.pool}", f"posemb={cfg.posemb}", f"classes={cfg.num_classes}",
             f"image={cfg.image_size[0]}x{cfg.image_size[1]}"]
    if cfg.rep_size:
        extra.append(f"pre-logits={cfg.rep_size}")
    if cfg.resnet_layers:
        extra.append(f"resnet={cfg.resnet_layers}x{cfg.resnet_width}")
    if cfg.window_size:
        extra.append(f"window={cfg.window_size} global_blocks={cfg.global_blocks}")
    extra += [name for name, on in (("rel_pos", cfg.rel_pos), ("dense", cfg.dense), ("distilled", cfg.distilled),
                                    (f"neck={cfg.neck_dim}", cfg.neck_dim),
                                    (f"layer_scale={cfg.layer_scale:g}", cfg.layer_scale),
                                    (f"registers={cfg.registers}", cfg.registers),
                                    ("ffn=swiglu", cfg.ffn == "swiglu")) if on]
    return (f"{cfg.name} (width {cfg.width}, depth {cfg.depth}, heads {cfg.num_heads}, mlp {cfg.mlp_dim}, "
            f"patch {cfg.patch_size[0]}x{cfg.patch_size[1]}, {', '.join(extra)})")


def _owns(variant: str) -> bool:
    try:
        parse_variant(variant)
        return True
    except ValueError:
        return False


def segmenter(cfg: ViTConfig, num_classes: int):
    """The dense ViT with its pixel head (models/segmentation.py) and its FLOPs."""
    return functools.partial(SegmentationViT, num_classes=num_classes), segmentation_flops(cfg, num_classes)


VIT = family.register(family.Family(
    name="ViT", config_type=ViTConfig, module=ViT, schema=training_schema(), owns_variant=_owns,
    from_training_config=from_training_config, from_meta=lambda model: vit_config(**model), describe=describe,
    flops=vit_flops, label=lambda cfg: "Hybrid" if cfg.resnet_layers else "ViT",
    analyses=("attention-distance", "posemb-similarity", "embedding-pcs", "attention-rollout"), fallback=True,
    segmenter=segmenter, dense_settings={"dense": True}))
