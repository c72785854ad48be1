"""The numbers behind the ViT paper's model analyses (Sec. 4.5): pure functions of parameters and attention weights.

- mean attention distance per layer and head (Fig. 7 right),
- cosine similarity of the learned position embeddings (Fig. 7 centre),
- principal components of the RGB patch-embedding filters (Fig. 7 left),
- attention rollout maps (Abnar & Zuidema, 2020; Fig. 6).

Attention arrays are (depth, batch, heads, T, T) softmax weights with queries on the second-to-last axis, as the
model's `capture=("attention",)` returns them; T = 1 + patches with a class token at position 0, else T = patches.
Functions take numpy or JAX arrays (jnp operations, so they can run inside jit next to the forward pass).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def patch_distances(grid: tuple[int, int], patch_px: tuple[int, int]) -> np.ndarray:
    """(N, N) Euclidean pixel distances between patch centres, patches in row-major order."""
    gh, gw = grid
    rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    centres = np.stack([rows.reshape(-1) * patch_px[0], cols.reshape(-1) * patch_px[1]], -1).astype(np.float64)
    # Centre offsets cancel in differences: corner coordinates give the same distances.
    diff = centres[:, None, :] - centres[None, :, :]
    return np.sqrt((diff ** 2).sum(-1)).astype(np.float32)


def patch_attention(attention: jax.Array, has_class_token: bool) -> jax.Array:
    """Attention among patches only: drop the class token as query and key, renormalise each row over patch keys."""
    if not has_class_token:
        return attention
    a = attention[..., 1:, 1:]
    return a / jnp.maximum(a.sum(-1, keepdims=True), 1e-12)


def attention_distance_per_image(attention: jax.Array, grid: tuple[int, int], patch_px: tuple[int, int],
                                 has_class_token: bool) -> jax.Array:
    """(depth, B, heads) mean attention distance in pixels of every image.

    For each query patch: the distance to every key patch weighted by the attention weight (class token excluded,
    weights renormalised over patches); then averaged over the query patches.
    """
    a = patch_attention(attention, has_class_token)
    n = grid[0] * grid[1]
    if a.shape[-1] != n:
        raise ValueError(f"attention over {a.shape[-1]} patches does not match the {grid[0]}x{grid[1]} grid")
    d = jnp.asarray(patch_distances(grid, patch_px))
    per_query = (a * d).sum(-1)  # (depth, B, heads, N)
    return per_query.mean(-1)


def mean_attention_distance(attention: jax.Array, grid: tuple[int, int], patch_px: tuple[int, int],
                            has_class_token: bool) -> np.ndarray:
    """(depth, heads) mean attention distance in pixels, averaged over query patches and images."""
    return np.asarray(attention_distance_per_image(attention, grid, patch_px, has_class_token).mean(1))


def attention_rollout(attention: jax.Array, has_class_token: bool) -> jax.Array:
    """(B, N) rollout relevance of each input patch.

    Per layer: average the heads, add the identity (the residual path), renormalise rows; multiply the layers from
    the first to the last. The class token's row gives the map; without a class token (gap/map pooling) the mean of
    all rows (every output token feeds the pooled representation).
    """
    a = attention.mean(2)  # (depth, B, T, T)
    t = a.shape[-1]
    a = a + jnp.eye(t, dtype=a.dtype)
    a = a / a.sum(-1, keepdims=True)

    def step(rollout, layer):
        return layer @ rollout, None

    rollout, _ = jax.lax.scan(step, jnp.broadcast_to(jnp.eye(t, dtype=a.dtype), a.shape[1:]), a)
    if has_class_token:
        return rollout[:, 0, 1:]
    return rollout.mean(1)


def rollout_masks(maps: jax.Array, grid: tuple[int, int], image_size: tuple[int, int]) -> np.ndarray:
    """(B, N) rollout maps -> (B, H, W) masks at image resolution (bilinear), each scaled to a maximum of 1."""
    b = maps.shape[0]
    m = jnp.asarray(maps, jnp.float32).reshape(b, *grid)
    m = m / jnp.maximum(m.max((1, 2), keepdims=True), 1e-12)
    m = jax.image.resize(m, (b, *image_size), method="bilinear")
    return np.asarray(jnp.clip(m, 0.0, 1.0))


def posemb_similarity(posemb: np.ndarray, grid: tuple[int, int], has_class_token: bool) -> np.ndarray:
    """(gh, gw, gh, gw) cosine similarity: [i, j] is the map of patch (i, j)'s similarity to every patch.

    `posemb` is (1, T, D) or (T, D); the class-token row (first, when present) is dropped.
    """
    p = np.asarray(posemb, np.float64).reshape(-1, np.shape(posemb)[-1])
    n = grid[0] * grid[1]
    if has_class_token and p.shape[0] == n + 1:
        p = p[1:]
    if p.shape[0] != n:
        raise ValueError(f"position embedding has {p.shape[0]} rows; expected {n} for a {grid[0]}x{grid[1]} grid")
    p = p / np.maximum(np.linalg.norm(p, axis=-1, keepdims=True), 1e-12)
    return (p @ p.T).reshape(*grid, *grid).astype(np.float32)


def embedding_pcs(kernel: np.ndarray, k: int = 28) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Principal components of the patch-embedding filters.

    `kernel` is (ph, pw, 3, D): D filters of ph*pw*3 values. Returns (components (k, ph, pw, 3) each rescaled to
    [0, 1] for display, the same components unscaled (unit norm), explained-variance ratios (k,)), k = min(k, D,
    ph*pw*3). Signs are fixed so each component's largest-magnitude entry is positive (SVD signs are arbitrary).
    """
    kernel = np.asarray(kernel, np.float64)
    ph, pw, c, d = kernel.shape
    if c != 3:
        raise ValueError(f"patch-embedding filters have {c} input channels, not RGB; embedding-pcs needs a plain ViT "
                         "(a hybrid's patch embedding reads ResNet features)")
    filters = kernel.reshape(ph * pw * c, d).T  # (D, F): one row per filter
    centred = filters - filters.mean(0, keepdims=True)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    k = min(k, vt.shape[0])
    comps = vt[:k]
    signs = np.sign(comps[np.arange(k), np.abs(comps).argmax(1)])
    comps = comps * signs[:, None]
    var = s ** 2
    ratio = var[:k] / max(var.sum(), 1e-30)
    lo, hi = comps.min(1, keepdims=True), comps.max(1, keepdims=True)
    scaled = (comps - lo) / np.maximum(hi - lo, 1e-12)
    shape = (k, ph, pw, c)
    return scaled.reshape(shape).astype(np.float32), comps.reshape(shape).astype(np.float32), ratio.astype(np.float32)
