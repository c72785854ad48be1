"""Image-text two towers (CLIP, Radford et al. 2021; SigLIP, Zhai et al. 2023; LiT, Zhai et al. 2022).

`TextTransformer`: token ids -> learned token and position embeddings -> pre-LN Transformer blocks (the image ViT's
`EncoderBlock`, bidirectional as SigLIP or causal as CLIP) -> final LayerNorm -> pooling -> linear head to the shared
embedding size. Pooling: `last` (the last position, SigLIP/big_vision), `eos` (the first `eos_id`, CLIP's EOT token;
CLIP finds it as the largest id, which is the same token in its vocabulary) or `map` (attention pooling).

`ImageText`: the parameter tree big_vision's two-tower model has: `img` (our ViT, usually with the MAP head, no
classification head), `img_proj` (linear to the embedding; none with `image_proj=False`, big_vision's image
`out_dim=None`, which open_clip's and Hugging Face's SigLIP mirror: the image tower's representation is the
embedding, so the embedding size is the tower's width), `txt` (the text tower with its head), and the scalars `t`
(log temperature, init log 10) and `b` (SigLIP's bias, init -10). With `lock_image` (LiT) the module holds no `img`:
the locked tower is the objective's extra state and is passed to `embed_image` as its own parameter tree.
Its forward pass (`__call__`) is the image tower's, so few-shot probes and `predict` read `pre_logits` as for a ViT.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax.models import layers as L
from vit_jax.models.config import DTYPES, GELUS, REMAT_POLICIES, ModelConfigError, ViTConfig
from vit_jax.models.vit import ViT

TEXT_POOLS = ("last", "eos", "map")


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """The text tower's shape. Defaults: SigLIP B/16's text tower (big_vision: 12 x 768, 12 heads, 64 tokens,
    32k SentencePiece vocabulary, bidirectional, last-token pooling)."""

    vocab_size: int = 32_000
    max_len: int = 64
    width: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    pool: str = "last"
    causal: bool = False
    eos_id: int = 1
    gelu: str = "tanh"
    ln_eps: float = 1e-6
    # Compute dtype and per-block rematerialisation, as the image tower's (ViTConfig.dtype / remat): the objective
    # sets them from model.* so that both towers of a large-batch run save the same kind of activations.
    dtype: str = "float32"
    remat: str = "none"

    def __post_init__(self):
        if min(self.vocab_size, self.max_len, self.width, self.depth, self.num_heads, self.mlp_dim) <= 0:
            raise ModelConfigError("text vocab_size, max_len, width, depth, num_heads and mlp_dim must all be > 0")
        if self.width % self.num_heads:
            raise ModelConfigError(f"text width {self.width} is not a multiple of its num_heads {self.num_heads}")
        if self.pool not in TEXT_POOLS:
            raise ModelConfigError(f"text pool '{self.pool}': choose one of {', '.join(TEXT_POOLS)}")
        if self.gelu not in GELUS:
            raise ModelConfigError(f"text gelu '{self.gelu}': choose one of {', '.join(GELUS)}")
        if self.dtype not in DTYPES or self.remat not in REMAT_POLICIES:
            raise ModelConfigError(f"text dtype '{self.dtype}' / remat '{self.remat}': choose a dtype of "
                                   f"{', '.join(DTYPES)} and a remat of {', '.join(REMAT_POLICIES)}")
        if not 0 <= self.eos_id < self.vocab_size:
            raise ModelConfigError(f"text eos_id {self.eos_id} is outside the vocabulary [0, {self.vocab_size})")


def _masked_self_attention(attn: L.MultiHeadAttention, x: jax.Array, mask: jax.Array) -> jax.Array:
    """Self-attention of (B, T, D) with a (T, T) boolean mask (True: may attend), through the block's own
    projections (the parameters of an unmasked block, so causal and bidirectional towers share one layout)."""
    q, k, v = attn.query.heads_first(x), attn.key.heads_first(x), attn.value.heads_first(x)
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    probs = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1).astype(v.dtype)
    return attn.out.heads_first(jnp.einsum("bhqk,bhkd->bhqd", probs, v))


class TextTransformer(nnx.Module):
    """Token ids (B, T) -> embeddings (B, out_dim) (not normalised); see the module docstring."""

    def __init__(self, cfg: TextConfig, out_dim: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(param_dtype=param_dtype, rngs=rngs)
        self.embedding = L.param(rngs, L.normal(0.02), (cfg.vocab_size, cfg.width), param_dtype, ("vocab", "embed"))
        self.pos_embedding = L.param(rngs, L.normal(0.02), (1, cfg.max_len, cfg.width), param_dtype,
                                     (None, None, "embed"))
        for i in range(cfg.depth):
            setattr(self, f"block_{i}", L.EncoderBlock(cfg.width, cfg.mlp_dim, cfg.num_heads, ln_eps=cfg.ln_eps, **kw))
        self.norm = L.LayerNorm(cfg.width, eps=cfg.ln_eps, **kw)
        self.map_head = L.MAPHead(cfg.width, cfg.mlp_dim, cfg.num_heads, **kw) if cfg.pool == "map" else None
        self.head = L.Linear(cfg.width, out_dim, ("embed", "mlp"), kernel_init=L.lecun_normal(1), **kw)

    def __call__(self, ids: jax.Array) -> tuple[jax.Array, dict[str, Any]]:
        cfg = self.cfg
        if ids.ndim != 2 or ids.shape[1] > cfg.max_len:
            raise ValueError(f"token ids of shape {ids.shape}: give (batch, length <= {cfg.max_len})")
        t = ids.shape[1]
        x = (jnp.take(self.embedding[...], ids, axis=0) + self.pos_embedding[:, :t]).astype(cfg.dtype)
        causal = jnp.tril(jnp.ones((t, t), bool))

        def run_block(x, graphdef, state):
            block = nnx.merge(graphdef, state)
            if cfg.causal:  # the block's two residual branches, attention under the causal mask
                x = x + _masked_self_attention(block.attn, block.ln1(x), causal)
                return x + block.mlp(block.ln2(x), gelu_kind=cfg.gelu)
            return block(x, gelu_kind=cfg.gelu)[0]

        if cfg.remat != "none":
            run_block = jax.checkpoint(run_block, policy=L.SAVED_UNDER_REMAT[cfg.remat], static_argnums=(1,))
        for i in range(cfg.depth):
            x = run_block(x, *nnx.split(getattr(self, f"block_{i}")))
        x = self.norm(x)
        if cfg.pool == "last":
            pooled = x[:, -1]
        elif cfg.pool == "eos":  # the first end-of-text token (position 0 when a row has none)
            pooled = jnp.take_along_axis(x, jnp.argmax(ids == cfg.eos_id, axis=1)[:, None, None], axis=1)[:, 0]
        else:
            pooled = self.map_head(x, gelu_kind=cfg.gelu)
        return self.head(pooled), {"encoded": x, "pre_logits": pooled}


def l2_normalize(x: jax.Array) -> jax.Array:
    """x / ||x|| over the last axis, +1e-8 as big_vision (a zero vector stays finite)."""
    return x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-8)


class ImageText(nnx.Module):
    """The two towers; see the module docstring. `FunctionalViT(cfg, functools.partial(ImageText, text=...,
    embed_dim=...))` makes it the objective's model."""

    def __init__(self, cfg: ViTConfig, *, text: TextConfig, embed_dim: int, lock_image: bool = False,
                 image_proj: bool = True, t_init: float = math.log(10.0), b_init: float = -10.0, rngs: nnx.Rngs):
        if cfg.num_classes:
            raise ModelConfigError("the image tower of a two-tower model has no classification head: num_classes=0")
        if embed_dim <= 0:
            raise ModelConfigError(f"embed_dim={embed_dim}: the shared embedding size must be > 0")
        features = cfg.rep_size or cfg.width
        if not image_proj and embed_dim != features:
            raise ModelConfigError(f"without an image projection the embedding is the image tower's {features} "
                                   f"features: set embed_dim={features} (it is {embed_dim})")
        self.cfg = cfg
        pd = jnp.dtype(cfg.param_dtype)
        self.img = None if lock_image else ViT(cfg, rngs=rngs)
        self.img_proj = L.Linear(features, embed_dim, ("embed", "mlp"), kernel_init=L.lecun_normal(1), param_dtype=pd,
                                 rngs=rngs) if image_proj else None
        self.txt = TextTransformer(text, embed_dim, param_dtype=pd, rngs=rngs)
        self.t = L.param(rngs, L.constant(t_init), (1,), jnp.float32, (None,))
        self.b = L.param(rngs, L.constant(b_init), (1,), jnp.float32, (None,))

    def image_features(self, images: jax.Array, image_tower: nnx.Module | None = None, **kw) -> jax.Array:
        tower = self.img if image_tower is None else image_tower
        if tower is None:
            raise ValueError("this two-tower model locks its image tower: pass it as `image_tower`")
        _, out = tower(images, **kw)
        return out["pre_logits"]

    def embed_image(self, images: jax.Array, image_tower: nnx.Module | None = None, **kw) -> jax.Array:
        """Images -> L2-normalised (B, embed_dim); `image_tower`: the locked tower of LiT (else `img`)."""
        features = self.image_features(images, image_tower, **kw)
        if self.img_proj is not None:
            features = self.img_proj(features)
        return l2_normalize(features.astype(jnp.float32))

    def embed_text(self, ids: jax.Array) -> jax.Array:
        """Token ids (B, T) -> L2-normalised (B, embed_dim)."""
        z, _ = self.txt(ids)
        return l2_normalize(z.astype(jnp.float32))

    def scalars(self) -> tuple[jax.Array, jax.Array]:
        """(temperature exp(t), bias b) as scalars."""
        return jnp.exp(self.t[0]), self.b[0]

    def __call__(self, images: jax.Array, **kw) -> tuple[jax.Array, dict[str, Any]]:
        if self.img is None:
            raise ValueError("this two-tower model locks its image tower (LiT): it is the objective's extra state")
        return self.img(images, **kw)
