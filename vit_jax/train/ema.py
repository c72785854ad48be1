"""Exponential moving average of the weights, for any objective (`ema.decay`; DeiT's `model_ema`, timm's ModelEmaV2).

With `ema.decay` = d in (0, 1) (validated by train/config.py) the train state carries `ema_params`, a copy of the parameters at step 0 that follows every
applied step: ema <- d * ema + (1 - d) * params (a step the NaN guard skips leaves it as it was). It is sharded as the
parameters, saved and restored with every checkpoint (an exact resume), and it is the run's weights: the run's
evaluators (its objective's and few-shot) read it in place of the parameters, and `vit-jax eval` / `predict`,
`init.checkpoint` and `distill.teacher` load it from the run (checkpoints/training.py load_state_from_run).

Why here and not an objective's extra state: an EMA of the weights belongs to any objective (a classifier's, a
distillation student's), while extra state belongs to one objective (a teacher); keeping it in the train step keeps
the two independent (a distillation run has a frozen teacher as extra state *and* EMA weights).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from vit_jax.checkpoints.training import EMA_PARAMS

__all__ = ["EMA_PARAMS", "ema_update", "init_ema", "weights"]


def ema_update(ema: Any, params: Any, decay: float) -> Any:
    """d * ema + (1 - d) * params, leaf by leaf, in the EMA's dtype."""
    return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p.astype(e.dtype), ema, params)


def init_ema(params: Any) -> Any:
    """The EMA at step 0: a copy of the parameters (a new buffer: the train step donates the state)."""
    return jax.tree.map(jnp.copy, params)


def weights(state: dict[str, Any]) -> Any:
    """The run's weights in a train state: the EMA when the run keeps one, else the parameters."""
    return state[EMA_PARAMS] if EMA_PARAMS in state else state["params"]
