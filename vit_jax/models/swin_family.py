"""The Swin Transformer family on the model-family registry (models/family.py): its training-config keys, config
construction, description, analytic FLOPs and report label. Its checkpoint formats: checkpoints/swin_formats.py."""

from __future__ import annotations

import functools
from typing import Any, Mapping

from vit_jax.models import family
from vit_jax.models.flops import Flops
from vit_jax.models.swin import Swin
from vit_jax.models.swin_config import SwinConfig, is_swin_name, swin_config
from vit_jax.models.swin_segmentation import SegmentationSwin, swin_segmentation_flops

# The model.* keys a Swin reads; the defaults are the ViT family's for the keys both read (the first family to name a
# key sets its default). window_size 0: the variant's (7, the window of every timm/paper ImageNet-1k model at 224).
# patch_size 0: the variant's (4).
SCHEMA = {"variant": "Ti/16", "image_size": 224, "window_size": 0, "patch_size": 0, "drop_path": 0.0,
          "dtype": "float32", "param_dtype": "float32", "remat": "none", "head_bias_init": 0.0}


def from_training_config(m: Mapping[str, Any], num_classes: int,
                         architecture: SwinConfig | None = None) -> SwinConfig:
    """The SwinConfig of `model.variant` ("Swin-T", "Swin-64-2-2"), or of the init checkpoint's Swin `architecture`
    when the variant is empty; a non-zero model.window_size (model.patch_size) overrides the window (patch) (init.checkpoint's bias tables are
    then resized: checkpoints/surgery.py); the head size comes from the dataset."""
    kw = {k: m[k] for k in SCHEMA if k not in ("variant", "window_size", "patch_size")}
    kw.update({k: m[k] for k in ("window_size", "patch_size") if m[k]})
    if architecture is not None and not m["variant"]:
        return architecture.replace(num_classes=num_classes, **kw)
    return swin_config(m["variant"], num_classes=num_classes, **kw)


def describe(cfg: SwinConfig) -> str:
    return (f"{cfg.name} (embed {cfg.embed_dim}, depths {'-'.join(map(str, cfg.depths))}, heads "
            f"{'-'.join(map(str, cfg.num_heads))}, window {cfg.window_size}, patch {cfg.patch_size[0]}x{cfg.patch_size[1]}, "
            f"classes={cfg.num_classes}, image={cfg.image_size[0]}x{cfg.image_size[1]})")


# XLA's FLOPs per element of the element-wise work (its cost analysis of each op on CPU, jax 0.10): the exact (erf)
# GELU is a polynomial of 64 operations, a float32 LayerNorm 6, a softmax 4 (the exponential is a transcendental).
GELU_OPS, LAYERNORM_OPS, SOFTMAX_OPS = 64, 6, 4


def swin_flops(cfg: SwinConfig) -> Flops:
    """Forward FLOPs per image: `matmul` parts (2 per multiply-add; the paper's Table 1 counts these) for the patch
    embedding, each block's projections on its grid padded to whole windows (the padding is computed on, as in the
    model), q.k logits and weights.v inside each window, the MLP, the patch merges and the head; and `elementwise`:
    biases, LayerNorms, softmax with its scale, bias and mask, the exact GELU (whose erf makes it ~5% of a Swin-T's
    count at 96 channels, so it is counted) and the residual sums."""
    (ph, pw), (gh, gw) = cfg.patch_size, cfg.stage_grid(0)
    c0 = cfg.embed_dim
    parts: dict[str, float] = {"patch_embedding": 2.0 * gh * gw * ph * pw * 3 * c0}
    elementwise = gh * gw * c0 * (1 + LAYERNORM_OPS)  # the embedding's bias, its LayerNorm
    for s, depth in enumerate(cfg.depths):
        d, (h, w), heads = cfg.stage_dim(s), cfg.stage_grid(s), cfg.num_heads[s]
        t, m = h * w, int(d * cfg.mlp_ratio)
        if s:
            parts[f"merge{s}"] = 2.0 * t * 4 * (d // 2) * d
            elementwise += t * 4 * (d // 2) * LAYERNORM_OPS
        (wh, ww), (sh, sw) = cfg.stage_window(s)
        padded = (-(-h // wh) * wh) * (-(-w // ww) * ww)
        attention = 2.0 * padded * d * 4 * d + 2.0 * 2 * padded * wh * ww * d  # q, k, v, out; logits, weights.v
        parts[f"stage{s}"] = depth * (attention + 2.0 * 2 * t * d * m)
        shifted = depth // 2 if (sh or sw) else 0
        logits = padded * wh * ww * heads
        elementwise += depth * (t * d * (2 * LAYERNORM_OPS + 2 + 1) + 4 * padded * d + t * m * (1 + GELU_OPS)
                                + logits * (2 + SOFTMAX_OPS)) + shifted * logits  # scale, bias (+ mask)
    t, d = cfg.stage_grid(len(cfg.depths) - 1), cfg.num_features
    elementwise += t[0] * t[1] * d * (LAYERNORM_OPS + 1)  # final LayerNorm, average pool
    if cfg.num_classes:
        parts["head"] = 2.0 * d * cfg.num_classes
        elementwise += cfg.num_classes
    parts["elementwise"] = float(elementwise)
    return Flops(forward=sum(parts.values()), breakdown=parts)


def segmenter(cfg: SwinConfig, num_classes: int):
    """The Swin with a pyramid head over its stage outputs (models/swin_segmentation.py) and its FLOPs."""
    flops = swin_segmentation_flops(cfg, num_classes, swin_flops(cfg.replace(num_classes=0)))
    return functools.partial(SegmentationSwin, num_classes=num_classes), flops


SWIN = family.register(family.Family(
    name="Swin", config_type=SwinConfig, module=Swin, schema=SCHEMA, owns_variant=is_swin_name,
    from_training_config=from_training_config, from_meta=lambda model: swin_config(**model), describe=describe,
    flops=swin_flops, label=lambda cfg: "Swin", segmenter=segmenter))
