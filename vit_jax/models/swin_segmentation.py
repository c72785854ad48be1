"""A Swin as a dense (per-pixel) model: its four stage outputs, a feature pyramid at strides p, 2p, 4p, 8p (p the
patch size), decoded by models/segmentation.py's PyramidHead (per-stage LayerNorm, 1x1 laterals, top-down upsample
and add, a pixel head on the finest map) into logits at the input resolution.

Parameters: the Swin's, less its final `norm` and classification head, plus `head/{norm{s},lateral{s},pixels}`; so a
classification Swin's checkpoint loads as the backbone, and `init.reinit=("head",)` gives the decoder a fresh init
(as for the dense ViT). Registered as the Swin family's `segmenter` (models/swin_family.py).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax.models.config import ModelConfigError
from vit_jax.models.flops import Flops
from vit_jax.models.segmentation import PyramidHead
from vit_jax.models.swin import Swin, _Keys
from vit_jax.models.swin_config import SwinConfig


def decoder_dim(cfg: SwinConfig) -> int:
    """Channels of the pyramid head: the first stage's (96 for Swin-T; UPerNet's 512 would be ~5x the head's cost,
    which the small demos cannot afford)."""
    return cfg.embed_dim


class SegmentationSwin(Swin):
    """A Swin backbone and its pyramid head. Build it as `functools.partial(SegmentationSwin, num_classes=K)` in
    FunctionalViT. Call: `(logits (B, H, W, K) float32, out)`, `out["pyramid"]` the stage outputs."""

    final_norm = False  # each stage is normalised in the head

    def __init__(self, cfg: SwinConfig, *, num_classes: int, rngs: nnx.Rngs):
        if num_classes < 2:
            raise ModelConfigError(f"a dense Swin needs at least 2 classes (got {num_classes})")
        super().__init__(cfg, rngs=rngs)
        dims = tuple(cfg.stage_dim(s) for s in range(len(cfg.depths)))
        # The Swin's `head` slot (None without classes) holds the decoder: nnx.data marks it as parameters.
        self.head = nnx.data(PyramidHead(dims, decoder_dim(cfg), cfg.patch_size, num_classes,
                                         param_dtype=jnp.dtype(cfg.param_dtype), rngs=_Keys(rngs.params())))

    def __call__(self, images: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
                 capture: tuple[str, ...] = ()) -> tuple[jax.Array, dict[str, Any]]:
        pyramid = self.stages(images, train=train, rng=rng, capture=capture)
        return self.head(pyramid).astype(jnp.float32), {"pyramid": pyramid}


def swin_segmentation_flops(cfg: SwinConfig, num_classes: int, backbone: Flops) -> Flops:
    """Forward FLOPs per image: the backbone's (`backbone`: the family's count of `cfg` without a head) less its final
    LayerNorm and pooling, plus the head: each stage's LayerNorm and lateral (matmul + bias), the upsampled sums, and
    the pixel head's LayerNorm and classifier on the finest grid. Element-wise ops at XLA's cost: a LayerNorm 6."""
    layernorm = 6
    d = decoder_dim(cfg)
    parts = dict(backbone.breakdown)
    (gh, gw), c = cfg.stage_grid(len(cfg.depths) - 1), cfg.num_features
    parts["elementwise"] -= gh * gw * c * (layernorm + 1)  # no final LayerNorm, no average pool
    head, elementwise = 0.0, 0.0
    for s in range(len(cfg.depths)):
        (h, w), c = cfg.stage_grid(s), cfg.stage_dim(s)
        head += 2.0 * h * w * c * d
        elementwise += h * w * (c * layernorm + d)  # LayerNorm, the lateral's bias
        if s < len(cfg.depths) - 1:
            elementwise += h * w * d  # the sum with the upsampled coarser map
    (h, w), (ph, pw) = cfg.stage_grid(0), cfg.patch_size
    head += 2.0 * h * w * d * ph * pw * num_classes
    elementwise += h * w * (d * layernorm + ph * pw * num_classes)
    parts["pyramid_head"] = head
    parts["elementwise"] += elementwise
    return Flops(forward=sum(parts.values()), breakdown=parts)
