"""Swin Transformer (Liu et al., 2021) in Flax NNX: shifted-window attention on a pyramid of patch grids.

Image -> 4x4 patch embedding (a strided conv, as the 4x4 "patch partition" + linear embedding) -> LayerNorm ->
stages; a stage after the first starts by merging each 2x2 group of tokens (concatenated in the order
(0,0), (1,0), (0,1), (1,1): LayerNorm over 4C, then a bias-free linear to 2C), then runs blocks
x + drop_path(WindowAttention(LN(x))), x + drop_path(MLP(LN(x))). Odd blocks roll the grid by half a window first
(the cyclic shift) and mask, with -100 (the paper's value), attention between tokens that the roll brought together from
different regions. Each block's attention adds a learned bias per head indexed by the relative offset of query and key
inside the window: a table of (2*Wh - 1) * (2*Ww - 1) rows. Where a stage's grid is not a multiple of the window it is
zero-padded at the bottom/right after the roll (the padded tokens take part as keys, unmasked, as in timm), and where
the grid is no larger than the window the window shrinks to the grid and does not shift. Final LayerNorm ->
global average pool -> zero-initialised linear head.

Parameter names: `patch_embed/{kernel,bias}`, `patch_norm`, `stage{s}/downsample/{norm,reduction}`,
`stage{s}/block{b}/{norm1,attn/{query,key,value,out,rel_bias},norm2,mlp/{fc1,fc2}}`, `norm`, `head`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_jax.models import layers as L
from vit_jax.models.swin_config import SwinConfig

MASKED = -100.0  # the shifted-window mask's logit offset (the paper's code and timm), not -inf


class _Keys:
    """Parameter keys folded from one key: drawing every parameter's key from nnx.Rngs costs ~20 ms each under
    eval_shape (as noted in models/bit.py), which a Swin-B's ~400 parameters would turn into seconds."""

    def __init__(self, key: jax.Array):
        self.key, self.count = key, 0

    def params(self) -> jax.Array:
        self.count += 1
        return jax.random.fold_in(self.key, self.count)


def truncated_normal(stddev: float):
    def init(key, shape, dtype):
        return stddev * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)

    return init


def relative_position_index(window: tuple[int, int]) -> np.ndarray:
    """(T, T) rows of the bias table for the T = Wh*Ww tokens of a window (row-major): the offset (dh, dw) of query
    and key is row (dh + Wh - 1) * (2*Ww - 1) + (dw + Ww - 1)."""
    wh, ww = window
    rows, cols = np.divmod(np.arange(wh * ww), ww)
    dh = rows[:, None] - rows[None, :] + wh - 1
    dw = cols[:, None] - cols[None, :] + ww - 1
    return dh * (2 * ww - 1) + dw


def shifted_window_mask(padded: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> np.ndarray:
    """(windows, T, T) additive mask of the shifted blocks: after rolling the (padded) grid up/left by `shift`, the
    last window of each axis holds tokens from up to three regions (inside, and wrapped around the edge); a query
    attends only to keys of its own region. Float32, 0 or MASKED."""
    labels = []
    for size, w, s in zip(padded, window, shift):
        idx = np.arange(size)
        labels.append(np.where(idx < size - w, 0, np.where(idx < size - s, 1, 2)))
    region = labels[0][:, None] * 3 + labels[1][None, :]  # (Hp, Wp)
    (hp, wp), (wh, ww) = padded, window
    region = region.reshape(hp // wh, wh, wp // ww, ww).transpose(0, 2, 1, 3).reshape(-1, wh * ww)
    return np.where(region[:, :, None] != region[:, None, :], MASKED, 0.0).astype(np.float32)


def window_partition(x: jax.Array, window: tuple[int, int]) -> jax.Array:
    """(B, Hp, Wp, C) -> (B, windows, Wh*Ww, C), windows in row-major order, tokens row-major inside each."""
    b, hp, wp, c = x.shape
    wh, ww = window
    x = x.reshape(b, hp // wh, wh, wp // ww, ww, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (hp // wh) * (wp // ww), wh * ww, c)


def window_merge(x: jax.Array, window: tuple[int, int], padded: tuple[int, int]) -> jax.Array:
    """Inverse of `window_partition`: (B, windows, Wh*Ww, C) -> (B, Hp, Wp, C)."""
    b, _, _, c = x.shape
    (wh, ww), (hp, wp) = window, padded
    x = x.reshape(b, hp // wh, wp // ww, wh, ww, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, hp, wp, c)


def resize_rel_bias_table(table: np.ndarray, window: tuple[int, int]) -> np.ndarray:
    """A ((2Wh'-1)(2Ww'-1), heads) bias table trained for a square window W' resampled (bicubic, the paper's and timm's
    choice when fine-tuning at another window) for `window`."""
    rows, heads = table.shape
    side = int(round(math.sqrt(rows)))
    if side * side != rows:
        raise ValueError(f"a relative position bias table of {rows} rows is not of a square window")
    new = (2 * window[0] - 1, 2 * window[1] - 1)
    if new == (side, side):
        return np.asarray(table)
    grid = jnp.asarray(table, jnp.float32).reshape(side, side, heads)
    resized = jax.image.resize(grid, (*new, heads), method="bicubic", antialias=False)
    return np.asarray(resized, dtype=np.asarray(table).dtype).reshape(new[0] * new[1], heads)


class WindowAttention(nnx.Module):
    """Multi-head self-attention inside each window, plus the relative position bias (and the shift mask)."""

    def __init__(self, dim: int, heads: int, window: tuple[int, int], *, param_dtype, rngs):
        kw = dict(param_dtype=param_dtype, rngs=rngs)
        self.query = L.HeadProjection(dim, heads, **kw)
        self.key = L.HeadProjection(dim, heads, **kw)
        self.value = L.HeadProjection(dim, heads, **kw)
        self.out = L.OutProjection(dim, heads, **kw)
        rows = (2 * window[0] - 1) * (2 * window[1] - 1)
        self.rel_bias = L.param(rngs, truncated_normal(0.02), (rows, heads), param_dtype, (None, "heads"))
        self.window = window

    def __call__(self, x: jax.Array, mask: np.ndarray | None) -> jax.Array:
        """x (B, windows, T, C); mask (windows, T, T) or None -> (B, windows, T, C)."""
        b, nw, t, c = x.shape
        flat = x.reshape(b * nw, t, c)
        q, k, v = self.query.heads_first(flat), self.key.heads_first(flat), self.value.heads_first(flat)
        logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
        index = relative_position_index(self.window)
        bias = self.rel_bias[...].astype(jnp.float32)[index].transpose(2, 0, 1)  # (heads, T, T)
        logits = logits + bias
        if mask is not None:
            logits = (logits.reshape(b, nw, -1, t, t) + jnp.asarray(mask)[None, :, None]).reshape(logits.shape)
        probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        out = self.out.heads_first(jnp.einsum("bhqk,bhkd->bhqd", probs, v))
        return out.reshape(b, nw, t, c)


class SwinBlock(nnx.Module):
    """(Shifted-)window attention and an MLP, each pre-LayerNorm with a residual (and stochastic depth)."""

    def __init__(self, cfg: SwinConfig, stage: int, shifted: bool, **kw):
        dim = cfg.stage_dim(stage)
        self.window, shift = cfg.stage_window(stage)
        self.shift = shift if shifted else (0, 0)
        self.norm1 = L.LayerNorm(dim, eps=cfg.ln_eps, **kw)
        self.attn = WindowAttention(dim, cfg.num_heads[stage], self.window, **kw)
        self.norm2 = L.LayerNorm(dim, eps=cfg.ln_eps, **kw)
        self.mlp = L.Mlp(dim, int(dim * cfg.mlp_ratio), **kw)

    def _attend(self, x: jax.Array) -> jax.Array:
        b, h, w, c = x.shape
        (wh, ww), (sh, sw) = self.window, self.shift
        if sh or sw:
            x = jnp.roll(x, (-sh, -sw), axis=(1, 2))
        padded = (h + -h % wh, w + -w % ww)
        if padded != (h, w):
            x = jnp.pad(x, ((0, 0), (0, padded[0] - h), (0, padded[1] - w), (0, 0)))
        mask = shifted_window_mask(padded, self.window, self.shift) if (sh or sw) else None
        y = window_merge(self.attn(window_partition(x, self.window), mask), self.window, padded)[:, :h, :w]
        return jnp.roll(y, (sh, sw), axis=(1, 2)) if (sh or sw) else y

    def __call__(self, x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
        keys = jax.random.split(key) if key is not None else (None, None)
        y = self._attend(self.norm1(x))
        x = x + (L.drop_path(y, rate, keys[0]) if rate else y)
        b, h, w, c = x.shape  # the MLP's activation hints name (batch, seq, channels)
        y = self.mlp(self.norm2(x).reshape(b, h * w, c), gelu_kind="exact").reshape(b, h, w, c)
        return x + (L.drop_path(y, rate, keys[1]) if rate else y)


class PatchMerging(nnx.Module):
    """(B, H, W, C) -> (B, H/2, W/2, 2C): each 2x2 group concatenated, LayerNorm(4C), bias-free linear to 2C."""

    def __init__(self, dim: int, *, eps: float, param_dtype, rngs):
        self.norm = L.LayerNorm(4 * dim, eps=eps, param_dtype=param_dtype, rngs=rngs)
        self.reduction = L.param(rngs, L.xavier_uniform_flat(1), (4 * dim, 2 * dim), param_dtype, ("mlp", "embed"))

    def __call__(self, x: jax.Array) -> jax.Array:
        b, h, w, c = x.shape
        # (B, H/2, row offset, W/2, column offset, C) -> column offset major, then row offset: the order
        # (0,0), (1,0), (0,1), (1,1) of the paper's x0..x3.
        x = x.reshape(b, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 4, 2, 5).reshape(b, h // 2, w // 2, 4 * c)
        return jnp.einsum("bhwi,io->bhwo", self.norm(x), self.reduction[...].astype(x.dtype))


class Swin(nnx.Module):
    """Swin Transformer; see SwinConfig. Call: `logits, out = model(images, train=False, rng=None)` with NHWC images;
    `out["pre_logits"]` are the pooled features, `out["pyramid"]` the (B, H_s, W_s, C_s) output of every stage."""

    # The final LayerNorm before pooling; a dense model (models/swin_segmentation.py) normalises each stage it reads
    # in its own head instead.
    final_norm: ClassVar[bool] = True

    def __init__(self, cfg: SwinConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(param_dtype=jnp.dtype(cfg.param_dtype), rngs=_Keys(rngs.params()))
        self.patch_embed = L.PatchEmbed(cfg.patch_size, 3, cfg.embed_dim, **kw)
        self.patch_norm = L.LayerNorm(cfg.embed_dim, eps=cfg.ln_eps, **kw)
        for s, depth in enumerate(cfg.depths):
            stage = nnx.Dict()
            if s:
                stage["downsample"] = PatchMerging(cfg.stage_dim(s - 1), eps=cfg.ln_eps, **kw)
            for i in range(depth):
                stage[f"block{i}"] = SwinBlock(cfg, s, shifted=bool(i % 2), **kw)
            setattr(self, f"stage{s}", stage)
        self.norm = L.LayerNorm(cfg.num_features, eps=cfg.ln_eps, **kw) if self.final_norm else None
        self.head = (L.Linear(cfg.num_features, cfg.num_classes, ("embed", "vocab"), kernel_init=L.zeros,
                              bias_init=L.constant(cfg.head_bias_init), **kw) if cfg.num_classes else None)

    def _block(self, block: SwinBlock, x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
        if self.cfg.remat == "none":
            return block(x, rate, key)
        graphdef, state = nnx.split(block)
        fn = jax.checkpoint(lambda st, y, k: nnx.merge(graphdef, st)(y, rate, k),
                            policy=L.SAVED_UNDER_REMAT[self.cfg.remat])
        return fn(state, x, key)

    def __call__(self, images: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
                 capture: tuple[str, ...] = ()) -> tuple[jax.Array, dict[str, Any]]:
        pyramid = self.stages(images, train=train, rng=rng, capture=capture)
        x = self.norm(pyramid[-1])
        features = x.astype(jnp.float32).mean(axis=(1, 2)).astype(x.dtype)
        logits = self.head(features) if self.head is not None else features
        return logits.astype(jnp.float32), {"pre_logits": features, "pyramid": pyramid}

    def stages(self, images: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
               capture: tuple[str, ...] = ()) -> tuple[jax.Array, ...]:
        """The (B, H_s, W_s, C_s) output of every stage (before any final LayerNorm)."""
        cfg = self.cfg
        if capture:
            raise ValueError(f"capture {sorted(capture)} is a ViT option; a Swin returns its stage outputs as "
                             "out['pyramid'] instead")
        stochastic = train and cfg.drop_path > 0
        if stochastic and rng is None:
            raise ValueError("train=True with drop_path needs an `rng` key")
        total = sum(cfg.depths)
        rates = cfg.drop_path * np.arange(total) / max(total - 1, 1)  # linear over all blocks, as timm's dpr
        keys = jax.random.split(rng, total) if stochastic else [None] * total
        x = self.patch_embed(images.astype(jnp.dtype(cfg.dtype)))
        x = self.patch_norm(x.reshape(x.shape[0], *cfg.stage_grid(0), cfg.embed_dim))
        pyramid, n = [], 0
        for s, depth in enumerate(cfg.depths):
            stage = getattr(self, f"stage{s}")
            if s:
                x = stage["downsample"](x)
            for i in range(depth):
                x = self._block(stage[f"block{i}"], x, float(rates[n]) if stochastic else 0.0, keys[n])
                n += 1
            pyramid.append(x)
        return tuple(pyramid)
