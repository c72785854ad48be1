"""Classification evaluation over a padded, masked eval pipeline: every example counted exactly once."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import numpy as np


def evaluate(eval_step: Callable, params: Any, batches: Iterable[dict]) -> dict[str, float]:
    """Sums the per-batch totals of `eval_step` (count, loss, top1, top5, prec1) and returns averages.

    Totals are accumulated on the host in float64, so large eval sets lose no precision.
    """
    totals: dict[str, float] = {}
    pending = None
    for batch in batches:
        out = eval_step(params, batch)
        if pending is not None:  # fetch the previous batch's sums while this one runs
            _accumulate(totals, pending)
        pending = out
    if pending is not None:
        _accumulate(totals, pending)
    count = totals.get("count", 0.0)
    if not count:
        raise ValueError("the evaluation split is empty")
    result = {"count": count}
    for k, v in totals.items():
        if k != "count":
            result[k] = v / count
    if hasattr(batches, "num_records"):  # the pipeline's eval iterator: rows it masked out as undecodable
        # Every record of the split is a real row unless it was undecodable, and `count` is already global.
        result["undecodable"] = float(batches.num_records - count)
    return result


def _accumulate(totals: dict[str, float], out: dict) -> None:
    for k, v in jax.device_get(out).items():
        totals[k] = totals.get(k, 0.0) + float(np.asarray(v, np.float64))
