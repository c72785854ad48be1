"""The model-family seam: a family registers, in its own module, everything the rest of the code asks of it.

A family (ViT and hybrid ViT: models/vit_family.py; BiT ResNet-v2: models/bit_family.py; or a module of a user's own)
is one `Family` record, registered with `register` (models/build.py imports the built-in ones: use the lookups
through it): its config dataclass and module, the `model.*` keys of the training config it reads (with
their defaults: the config schema is the union of all families' keys), how a training config and a checkpoint's
metadata become its config, a one-line description, analytic FLOPs, the label reports group it under, which
analyses apply, and its dense (per-pixel) model if it has one. Nothing outside a family's module and this registry
asks which family a model is: they call these.
Checkpoint formats (official layouts, timm, BiT's) register with their family's name in vit_jax/checkpoints/formats.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from vit_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Family:
    name: str  # "ViT", "BiT": recorded in checkpoints' metadata (model_family)
    config_type: type  # its frozen config dataclass (what checkpoint loaders return)
    module: Callable  # the model class, module(cfg, rngs=...) (models/vit.py FunctionalViT wraps it)
    # The training config's model.* keys it reads, with their defaults; any other family's key must stay at its
    # default (one line naming them when it does not).
    schema: Mapping[str, Any]
    owns_variant: Callable[[str], bool]  # does model.variant name one of its models ("B/16", "BiT-R50x1")?
    # (model.* values, head size, the init checkpoint's config or None) -> its config.
    from_training_config: Callable[[Mapping[str, Any], int, Any], Any]
    from_meta: Callable[[Mapping[str, Any]], Any]  # a checkpoint's recorded model dict -> its config
    describe: Callable[[Any], str]  # one line naming a model and the settings that tell models apart
    flops: Callable[[Any], Any]  # analytic forward FLOPs per example (models/flops.Flops)
    label: Callable[[Any], str]  # the family reports group it under (the paper's ViT / Hybrid / ResNet)
    analyses: tuple[str, ...] = ()  # the `vit-jax analyze` analyses its models support
    fallback: bool = False  # the family of a variant no other family owns (it names the error), and of custom sizes
    # Dense prediction (per-pixel classes; the dense objective, train/objectives/): (its config, classes) -> (the module
    # class to build in place of `module`, called (cfg, rngs=...) -> ((B, H, W, classes) logits, out); its analytic
    # forward FLOPs). None: the family has no dense model. `dense_settings`: the model.* values that model needs
    # (a ViT's dense=True; a Swin's stage outputs are always there: none).
    segmenter: Callable[[Any, int], tuple[Callable, Any]] | None = None
    dense_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    old = FAMILIES.get(family.name)
    if old is not None and (old.config_type.__module__, old.config_type.__qualname__) == (
            family.config_type.__module__, family.config_type.__qualname__):
        del FAMILIES[family.name]  # its module executed again (a config file that registers a family, read anew)
    assert family.name not in FAMILIES, f"model family {family.name} registered twice"
    assert not (family.fallback and any(f.fallback for f in FAMILIES.values())), "one fallback family"
    FAMILIES[family.name] = family
    return family


def family_of(cfg: Any) -> Family:
    """The family of a model config (by its type)."""
    for family in FAMILIES.values():
        if type(cfg) is family.config_type:
            return family
    raise TypeError(f"no model family registered for config type {type(cfg).__name__}")


def family_named(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(f"unknown model family '{name}'; registered: {', '.join(FAMILIES)}") from None


def family_for_variant(variant: str) -> Family:
    """The family that owns `variant`; the fallback family for "" (custom sizes) and for names nobody owns (its
    config then says in one line what the known variants are)."""
    if variant:
        for family in FAMILIES.values():
            if not family.fallback and family.owns_variant(variant):
                return family
    return next(f for f in FAMILIES.values() if f.fallback)


def schema() -> dict[str, Any]:
    """config.model: every registered family's keys with their defaults (the first family to name a key sets it)."""
    out: dict[str, Any] = {}
    for family in FAMILIES.values():
        for key, default in family.schema.items():
            out.setdefault(key, default)
    return out


def model_config(model: Mapping[str, Any], num_classes: int, architecture: Any = None) -> Any:
    """The model config of a training config's `model.*` values: the family of model.variant, or of the init
    checkpoint's `architecture` when the variant is empty; keys of other families must be left at their defaults."""
    if not model["variant"] and architecture is not None:
        family = family_of(architecture)
    else:
        family = family_for_variant(model["variant"])
    defaults = schema()
    foreign = sorted(k for k in defaults if k not in family.schema and model[k] != defaults[k])
    if foreign:
        name = f"model.variant={model['variant']}" if model["variant"] else f"init.checkpoint ({architecture.name})"
        raise ConfigError(f"{name} is a {family.name} model, which has no "
                          f"{', '.join(f'model.{k}' for k in foreign)} (options of other model families): leave "
                          "them at their defaults")
    return family.from_training_config({k: model[k] for k in family.schema}, num_classes, architecture)


def from_meta(meta: Mapping[str, Any]) -> Any:
    """The model config a checkpoint's metadata records: by its `model_family`, or (checkpoints written before
    families were recorded) the family whose config has exactly the recorded fields."""
    model = meta["model"]
    if "model_family" in meta:
        return family_named(meta["model_family"]).from_meta(model)
    for family in FAMILIES.values():
        if set(model) == {f.name for f in dataclasses.fields(family.config_type)}:
            return family.from_meta(model)
    raise ConfigError(f"the checkpoint's model fields ({', '.join(sorted(model))}) match no registered model family "
                      f"({', '.join(FAMILIES)})")

