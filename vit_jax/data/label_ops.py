"""Label and key ops: onehot, multihot, keep, drop."""

from __future__ import annotations

import numpy as np

from vit_jax.data.pp import Example, Op, register


def _targets(n: int, on: float, off: float, key: str, out: str, ids_of, name: str) -> Op:
    """example[out] = float32 (n,) vector: `on` at the class ids ids_of(example[key]), `off` elsewhere.

    Label smoothing is the loss's option (loss.label_smoothing, applied after mixup), not an op argument: one
    place for it. on/off remain for targets of other values (e.g. big_vision's sigmoid on=0.9999).
    """
    on_v, off_v = np.float32(on), np.float32(off)

    def op(ex: Example, rng: np.random.Generator) -> Example:
        ids = ids_of(ex[key])
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"{name}({n}): label {ids.tolist() if ids.size > 1 else int(ids[0])} is out of range; is "
                             "n the dataset's number of classes?")
        vec = np.full((n,), off_v, np.float32)
        vec[ids] = on_v
        return {**ex, out: vec}

    return op


@register("onehot")
def make_onehot(n: int, on: float = 1.0, off: float = 0.0, key: str = "label", out: str = "labels") -> Op:
    """example[out] = float32 (n,) vector: `on` at example[key], `off` elsewhere."""
    return _targets(n, on, off, key, out, lambda label: np.asarray([int(label)]), "onehot")


@register("multihot")
def make_multihot(n: int, on: float = 1.0, off: float = 0.0, key: str = "labels", out: str = "labels") -> Op:
    """example[out] = float32 (n,) vector with `on` at every class id listed in example[key]."""
    return _targets(n, on, off, key, out, lambda ids: np.asarray(ids, np.int64).reshape(-1), "multihot")


@register("keep")
def make_keep(*keys: str) -> Op:
    """Keeps only the named keys."""
    return lambda ex, rng: {k: v for k, v in ex.items() if k in keys}


@register("drop")
def make_drop(*keys: str) -> Op:
    """Removes the named keys."""
    return lambda ex, rng: {k: v for k, v in ex.items() if k not in keys}
