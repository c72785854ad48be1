"""Global arrays -> host numpy copies (complete on every process)."""

from __future__ import annotations

import jax
import numpy as np


def gather_to_host(x: jax.Array) -> np.ndarray:
    """The whole global array on every process (all-gather across processes when there are several)."""
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))
