"""Layer-wise learning-rate decay (BEiT, Bao et al. 2022; the MAE fine-tuning recipe, He et al. 2022).

A ViT of depth L is read as L + 2 layers: id 0 the embeddings (patch embedding, class token, position embedding),
id i + 1 encoder block i, id L + 1 everything after the blocks (final LayerNorm, MAP head, pre-logits, head). The
update of a parameter of layer id k is multiplied by decay^(L + 1 - k): the head learns at the full rate, block i
at decay^(L - i), the embeddings at decay^(L + 1). This is the layer assignment of BEiT's and MAE's fine-tuning code.
Their scale multiplies a parameter group's lr, i.e. the whole AdamW step including the decoupled weight decay, and
SGD's step after the momentum, so here it multiplies the final update (after weight decay, with the lr schedule).

A hybrid ViT's ResNet stem is the patch embedding's feature extractor, so it is a part of layer 0 (decay^(L + 1)).
SAM-style per-block relative position tables (`encoder/rel_pos_i`) belong to block i. A BiT ResNet has no blocks
to count and is refused.

Our encoder blocks are stacked along a leading `layers` axis (one array for all blocks, models/vit.py), so a block
parameter's scale is a vector of shape (L, 1, ..., 1) multiplying the rows of the stacked update, not one scalar.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax.train.config import ConfigError

EMBEDDING_PARAMS = ("embedding", "cls", "pos_embedding", "stem")  # top-level names of layer 0


def is_on(decay: float) -> bool:
    """0 and 1 both mean off (1 would scale everything by 1; 0 is the config's "unset")."""
    return 0.0 < decay < 1.0


def layer_scales(params: Any, decay: float) -> Any:
    """The update scale of every parameter: a float, or a (L, 1, ..., 1) float32 array for stacked block leaves.

    `params` may be arrays or ShapeDtypeStructs (only names and shapes are read).
    """
    blocks = params.get("encoder", {}).get("blocks") if isinstance(params, dict) else None
    if not blocks:
        raise ConfigError("optimizer.layer_decay needs a ViT's encoder blocks and this model has none (a BiT "
                          "ResNet?): set optimizer.layer_decay=0")
    depth = jax.tree.leaves(blocks)[0].shape[0]
    per_block = np.float64(decay) ** (depth - np.arange(depth))  # block i: decay^(L - i)

    def scale(path, leaf):
        names = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
        if names[0] in EMBEDDING_PARAMS:
            return float(np.float64(decay) ** (depth + 1))
        if names[0] == "encoder" and names[1] == "blocks":
            assert leaf.shape[0] == depth, (names, leaf.shape)
            return per_block.astype(np.float32).reshape((depth,) + (1,) * (len(leaf.shape) - 1))
        if names[0] == "encoder" and str(names[1]).startswith("rel_pos_"):
            return float(per_block[int(str(names[1]).removeprefix("rel_pos_"))])
        return 1.0

    return jax.tree_util.tree_map_with_path(scale, params)


class ScaleByLayerState(NamedTuple):
    """No state: the scales are constants of the parameter names."""


def scale_by_layer(scales: Any) -> optax.GradientTransformation:
    """Multiplies each update by its scale from `layer_scales` (leaves of scale 1.0 are passed through untouched)."""

    def init(params):
        del params
        return ScaleByLayerState()

    def update(updates, state, params=None):
        del params

        def apply(u, s):
            if isinstance(s, float) and s == 1.0:
                return u
            return u * jnp.asarray(s, u.dtype)  # in the update's dtype: a bf16 update stays bf16

        return jax.tree.map(apply, updates, scales), state

    return optax.GradientTransformation(init, update)
