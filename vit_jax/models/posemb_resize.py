"""DINOv2's interpolation of a learned position-embedding grid to another grid, as separable resize matrices.

DINOv2 (`interpolate_pos_encoding`) resizes its table (37x37 for its 518 px checkpoints) with PyTorch's bicubic
interpolation (Keys' kernel with a = -0.75, half-pixel centres, edge samples clamped, no antialiasing) given a scale
factor (new + 0.1) / old rather than the output size: the 0.1 offset is DINO's historical guard against a floating
point error, kept for backward compatibility, and it shifts the sampling positions slightly. That differs from
`jax.image.resize`'s cubic (a = -0.5, weights renormalised at the edges), which is what timm's
`resample_abs_pos_embed` computes when enlarging a table (shrinking, timm antialiases). The matrices are built with numpy from static sizes, so the same function serves
checkpoint surgery (numpy) and a model resizing its table while tracing (DINO's crops of other sizes).
"""

from __future__ import annotations

import math

import numpy as np

DINOV2_OFFSET = 0.1
_A = -0.75  # PyTorch's bicubic coefficient


def _cubic(t: np.ndarray) -> np.ndarray:
    t = np.abs(t)
    near = ((_A + 2) * t - (_A + 3)) * t * t + 1
    far = ((_A * t - 5 * _A) * t + 8 * _A) * t - 4 * _A
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def dinov2_resize_matrix(old: int, new: int, offset: float = DINOV2_OFFSET) -> np.ndarray:
    """(new, old) float64 matrix: row i holds the weights of output position i over the `old` input positions."""
    if math.floor(old * ((new + offset) / old)) != new:
        raise ValueError(f"a scale factor ({new} + {offset}) / {old} does not give {new} positions")
    ratio = old / (new + offset)  # PyTorch maps output i to input (i + 0.5) / scale - 0.5 when given a scale
    m = np.zeros((new, old))
    for i in range(new):
        src = (i + 0.5) * ratio - 0.5
        base = math.floor(src)
        for tap in range(-1, 3):
            m[i, min(max(base + tap, 0), old - 1)] += _cubic(np.float64(src - (base + tap)))
    return m


def resize_dinov2(grid, new_grid: tuple[int, int], xp=np):
    """A (gh, gw, D) or (B, gh, gw, D) grid -> (new_h, new_w, D) (batch kept) with DINOv2's interpolation; `xp` is
    numpy or jax.numpy (the computation is two matmuls, in float32)."""
    rows = xp.asarray(dinov2_resize_matrix(grid.shape[-3], new_grid[0]), dtype=xp.float32)
    cols = xp.asarray(dinov2_resize_matrix(grid.shape[-2], new_grid[1]), dtype=xp.float32)
    return xp.einsum("ih,...hwd,jw->...ijd", rows, grid.astype(xp.float32), cols)
