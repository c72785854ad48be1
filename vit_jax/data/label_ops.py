"""Label and key ops: onehot, multihot, keep, drop."""

from __future__ import annotations

import numpy as np

from vit_jax.data.pp import Example, Op, register


def _on_off(n: int, on: float, off: float, smoothing: float) -> tuple[np.float32, np.float32]:
    # Label smoothing s spreads s uniformly over all n classes: on = 1 - s + s/n, off = s/n.
    if smoothing:
        on, off = 1.0 - smoothing + smoothing / n, smoothing / n
    return np.float32(on), np.float32(off)


@register("onehot")
def make_onehot(n: int, on: float = 1.0, off: float = 0.0, smoothing: float = 0.0, key: str = "label",
                out: str = "labels") -> Op:
    """example[out] = float32 (n,) vector: `on` at example[key], `off` elsewhere (smoothing=s sets on/off)."""
    on_v, off_v = _on_off(n, on, off, smoothing)

    def op(ex: Example, rng: np.random.Generator) -> Example:
        label = int(ex[key])
        if not 0 <= label < n:
            raise ValueError(f"onehot({n}): label {label} is out of range; is n the dataset's number of classes?")
        vec = np.full((n,), off_v, np.float32)
        vec[label] = on_v
        return {**ex, out: vec}

    return op


@register("multihot")
def make_multihot(n: int, on: float = 1.0, off: float = 0.0, smoothing: float = 0.0, key: str = "labels",
                  out: str = "labels") -> Op:
    """example[out] = float32 (n,) vector with `on` at every class id listed in example[key]."""
    on_v, off_v = _on_off(n, on, off, smoothing)

    def op(ex: Example, rng: np.random.Generator) -> Example:
        ids = np.asarray(ex[key], np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"multihot({n}): label ids {ids.tolist()} out of range")
        vec = np.full((n,), off_v, np.float32)
        vec[ids] = on_v
        return {**ex, out: vec}

    return op


@register("keep")
def make_keep(*keys: str) -> Op:
    """Keeps only the named keys."""
    return lambda ex, rng: {k: v for k, v in ex.items() if k in keys}


@register("drop")
def make_drop(*keys: str) -> Op:
    """Removes the named keys."""
    return lambda ex, rng: {k: v for k, v in ex.items() if k not in keys}
