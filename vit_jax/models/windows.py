"""Attention on the 2D patch grid: window partitioning and decomposed relative position bias (SAM / ViTDet).

The computation follows Segment Anything's image encoder (Kirillov et al., 2023) and ViTDet (Li et al., 2022):
the (B, H, W, C) grid is zero-padded at the bottom/right to a multiple of the window, cut into windows that attend
independently (the padded tokens take part as keys, unmasked, exactly as there), stitched back and cropped. The
relative position bias is decomposed into a row and a column term, each looked up in a table of 2*S-1 rows for an
attention of size S, linearly interpolated (half-pixel centres, no antialiasing) when the table was trained for
another size.

Pure functions of arrays: no parameters, no knowledge of the model.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def window_partition(x: jax.Array, window: int) -> tuple[jax.Array, tuple[int, int]]:
    """(B, H, W, C) -> (B * nh * nw, window, window, C) after padding H, W up to multiples of `window`."""
    b, h, w, c = x.shape
    pad_h, pad_w = -h % window, -w % window
    if pad_h or pad_w:
        x = jnp.pad(x, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))
    hp, wp = h + pad_h, w + pad_w
    x = x.reshape(b, hp // window, window, wp // window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window, window, c), (hp, wp)


def window_unpartition(windows: jax.Array, window: int, padded: tuple[int, int], size: tuple[int, int]) -> jax.Array:
    """Inverse of `window_partition`: windows -> (B, H, W, C), the padding cropped away."""
    hp, wp = padded
    nh, nw = hp // window, wp // window
    c = windows.shape[-1]
    x = windows.reshape(-1, nh, nw, window, window, c).transpose(0, 1, 3, 2, 4, 5).reshape(-1, hp, wp, c)
    return x[:, :size[0], :size[1]]


def resize_rel_pos(table: jax.Array, length: int) -> jax.Array:
    """A (L, C) relative-position table resampled to `length` rows, as torch's linear interpolate (SAM) does it."""
    if table.shape[0] == length:
        return table
    return jax.image.resize(table, (length, table.shape[1]), method="linear", antialias=False).astype(table.dtype)


def rel_pos_lookup(table: jax.Array, size: int) -> jax.Array:
    """(2*size-1, C) table -> (size, size, C): entry [i, j] is the embedding of the offset i - j (queries = keys)."""
    table = resize_rel_pos(table, 2 * size - 1)
    offsets = np.arange(size)[:, None] - np.arange(size)[None, :] + size - 1
    return table[offsets]


def rel_pos_bias(q: jax.Array, table_h: jax.Array, table_w: jax.Array, size: tuple[int, int]) -> jax.Array:
    """Decomposed relative position bias of queries (B, heads, S_h*S_w, C): (B, heads, T, T) in float32.

    bias[q=(i, j), k=(m, n)] = <q, Rh[i - m]> + <q, Rw[j - n]> with the unscaled query, as in SAM.
    """
    sh, sw = size
    b, n, t, c = q.shape
    rq = q.reshape(b, n, sh, sw, c).astype(jnp.float32)
    rel_h = jnp.einsum("bnhwc,hkc->bnhwk", rq, rel_pos_lookup(table_h, sh).astype(jnp.float32))
    rel_w = jnp.einsum("bnhwc,wkc->bnhwk", rq, rel_pos_lookup(table_w, sw).astype(jnp.float32))
    return (rel_h[..., :, None] + rel_w[..., None, :]).reshape(b, n, t, sh * sw)


def biased_attention(q, k, v, bias: jax.Array | None, *, dropout_fn=None, return_weights: bool = False):
    """Softmax attention over (B, heads, T, head_dim) with an additive float32 logit bias; same layout out."""
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * (1.0 / math.sqrt(q.shape[-1]))
    if bias is not None:
        logits = logits + bias
    weights = jax.nn.softmax(logits, axis=-1)
    probs = (dropout_fn(weights) if dropout_fn is not None else weights).astype(v.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v), (weights if return_weights else None)
