"""Masked autoencoder (MAE; He et al. 2022): the ViT encoder sees a random 25% of the patches, a light decoder
reconstructs the pixels of the others.

`MAEViT` is the project's ViT (same parameter names and shapes, no head) plus a `decoder` subtree, so the encoder of
an MAE run loads into a classification ViT for fine-tuning as it is, and the decoder is simply not read. Its forward
pass (`__call__`) is the plain ViT's on the whole image (the features a few-shot probe reads); `reconstruct` is the
pretraining pass.

Masks are drawn per example from `fold_in(key, row)` (`row` the example's index in the global batch), so an
example's mask does not depend on how the batch is split over devices, processes or micro-batches.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax.models import layers as L
from vit_jax.models.config import ModelConfigError, ViTConfig
from vit_jax.models.vit import Encoder, ViT, posemb_sincos_2d

# fold_in constant of the masks' random stream: independent of the dropout / mixup keys of the same step.
MASK_STREAM = 0x4D414531


@dataclasses.dataclass(frozen=True)
class MAEConfig:
    """The MAE-specific settings (the encoder is a ViTConfig). Defaults: the paper's (decoder 512 wide, 8 deep)."""

    mask_ratio: float = 0.75
    decoder_width: int = 512
    decoder_depth: int = 8
    decoder_heads: int = 16
    decoder_mlp_dim: int = 2048
    norm_pix_loss: bool = True  # targets normalised per patch (mean 0, variance 1): the paper's better variant

    def __post_init__(self):
        if not 0.0 < self.mask_ratio < 1.0:
            raise ModelConfigError(f"mae.mask_ratio={self.mask_ratio}: give a fraction in (0, 1), e.g. 0.75")
        if min(self.decoder_width, self.decoder_depth, self.decoder_heads, self.decoder_mlp_dim) <= 0:
            raise ModelConfigError("mae.decoder_width, decoder_depth, decoder_heads and decoder_mlp_dim must be > 0")

    def num_visible(self, num_patches: int) -> int:
        """Patches the encoder sees per image: int(N * (1 - mask_ratio)) as in the paper, at least 1, at most N-1."""
        return min(num_patches - 1, max(1, int(num_patches * (1.0 - self.mask_ratio))))


def check_encoder(cfg: ViTConfig) -> None:
    """The ViT options MAE supports: its encoder runs on a gathered subset of patches, so no attention on the grid,
    no ResNet stem, and a class token or average pooling (a MAP head would get no training signal)."""
    bad = [name for name, on in (("window_size", cfg.window_size), ("rel_pos", cfg.rel_pos), ("dense", cfg.dense),
                                 ("resnet_layers", cfg.resnet_layers), ("rep_size", cfg.rep_size),
                                 ("pool='map'", cfg.pool == "map"),
                                 ("registers", cfg.registers)) if on]
    if bad:
        raise ModelConfigError(f"MAE pretrains a plain ViT; model.{', model.'.join(bad)} is not supported with "
                               "objective='mae' (use pool 'token' or 'gap' and leave these at their defaults)")


def decoder_config(cfg: ViTConfig, mae: MAEConfig) -> ViTConfig:
    """The decoder's blocks as a ViTConfig (Encoder builds them): the encoder's options at the decoder's size."""
    return cfg.replace(width=mae.decoder_width, depth=mae.decoder_depth, num_heads=mae.decoder_heads,
                       mlp_dim=mae.decoder_mlp_dim, dropout=0.0, attention_dropout=0.0, drop_path=0.0,
                       num_classes=0, posemb="sincos2d")


def patch_orders(key: jax.Array, rows: jax.Array, num_patches: int) -> jax.Array:
    """(B, N) int32: a random order of the patches for every example, from `fold_in(key, rows[i])`. The first
    `num_visible` patches of an example's order are visible, the rest masked."""
    return jax.vmap(lambda r: jax.random.permutation(jax.random.fold_in(key, r), num_patches))(rows).astype(jnp.int32)


def masked(orders: jax.Array, num_visible: int) -> jax.Array:
    """(B, N) float32: 1 where a patch is masked (not among the first `num_visible` of its example's order)."""
    ranks = jnp.argsort(orders, axis=-1)  # patch -> its position in the order
    return (ranks >= num_visible).astype(jnp.float32)


def reconstruction_loss(pred: jax.Array, images: jax.Array, mask: jax.Array, patch_size: tuple[int, int],
                        norm_pix: bool = True) -> jax.Array:
    """Per-example MAE loss (B,): the mean squared error over the pixels of each masked patch, averaged over the
    masked patches. With `norm_pix` the target patches are normalised by their own mean and variance (the paper's
    code uses the unbiased variance and eps 1e-6)."""
    target = L.patchify(images.astype(jnp.float32), patch_size)
    if norm_pix:
        mean = target.mean(-1, keepdims=True)
        var = target.var(-1, keepdims=True, ddof=1)
        target = (target - mean) / jnp.sqrt(var + 1e-6)
    per_patch = jnp.square(pred.astype(jnp.float32) - target).mean(-1)
    return (per_patch * mask).sum(-1) / mask.sum(-1)


class MAEDecoder(nnx.Module):
    """Linear to the decoder width, mask tokens in the masked places, fixed 2-D sin-cos positions, Transformer blocks,
    LayerNorm, and a linear prediction of every patch's pixels."""

    def __init__(self, cfg: ViTConfig, mae: MAEConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        dw = mae.decoder_width
        ph, pw = cfg.patch_size
        self.embed = L.Linear(cfg.width, dw, ("embed", "mlp"), kernel_init=L.xavier_uniform_flat(1), param_dtype=pd,
                              rngs=rngs)
        self.mask_token = L.param(rngs, L.normal(0.02), (1, 1, dw), pd, (None, None, "embed"))
        self.transformer = Encoder(decoder_config(cfg, mae), rngs=rngs)
        self.pred = L.Linear(dw, ph * pw * 3, ("embed", "vocab"), kernel_init=L.xavier_uniform_flat(1),
                             param_dtype=pd, rngs=rngs)
        self.width = dw
        self.grid = cfg.grid

    def __call__(self, encoded: jax.Array, orders: jax.Array, has_cls: bool) -> jax.Array:
        """`encoded` (B, [1 +] K, D): the encoder's output on the visible patches (in `orders` order) -> (B, N, P)
        predicted pixels of every patch, in grid order."""
        x = self.embed(encoded)
        b, n = orders.shape
        cls, visible = (x[:, :1], x[:, 1:]) if has_cls else (None, x)
        fill = jnp.broadcast_to(self.mask_token[...].astype(x.dtype), (b, n - visible.shape[1], self.width))
        shuffled = jnp.concatenate([visible, fill], axis=1)  # in `orders` order
        ranks = jnp.argsort(orders, axis=-1)
        x = jnp.take_along_axis(shuffled, ranks[..., None], axis=1)  # back to grid order
        x = x + jnp.asarray(posemb_sincos_2d(*self.grid, self.width), x.dtype)
        if cls is not None:  # the class token (no position, as in the encoder) takes part in the decoder's attention
            x = jnp.concatenate([cls, x], axis=1)
        x, _, _ = self.transformer(x)
        return self.pred(x[:, 1:] if cls is not None else x)


class MAEViT(ViT):
    """A ViT encoder (no head) and an MAE decoder. `module=functools.partial(MAEViT, mae=...)` in FunctionalViT."""

    def __init__(self, cfg: ViTConfig, *, mae: MAEConfig, rngs: nnx.Rngs):
        check_encoder(cfg)
        if cfg.num_classes:
            raise ModelConfigError("an MAE model has no classification head: build it with num_classes=0")
        super().__init__(cfg, rngs=rngs)
        self.decoder = MAEDecoder(cfg, mae, rngs=rngs)
        self.num_visible = mae.num_visible(cfg.num_patches)

    def reconstruct(self, images: jax.Array, orders: jax.Array, *, rng: jax.Array | None = None) -> jax.Array:
        """Images (B, H, W, 3) and patch orders (B, N) -> predicted pixels (B, N, ph*pw*3) of every patch. The
        encoder sees the class token and the first `num_visible` patches of each order; `rng` (training) drives the
        encoder's dropout and stochastic depth."""
        cfg = self.cfg
        patches, cls = self.tokens(images)
        visible = jnp.take_along_axis(patches, orders[:, :self.num_visible, None], axis=1)
        x = visible if cls is None else jnp.concatenate([cls, visible], axis=1)
        k_embed, k_enc = jax.random.split(rng) if rng is not None else (None, None)
        x = L.dropout(x, cfg.dropout, k_embed)
        encoded, _, _ = self.encoder(x, key=k_enc)
        return self.decoder(encoded, orders, cls is not None)

