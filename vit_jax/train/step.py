"""The jitted train step (a pure function of state and batch; sharding is applied by the caller). Eval steps: eval/steps.py.

Train state: {"params", "opt_state", "step", "rng" (key data of the run's seed), "skipped", "consecutive_skips"}
(and "loss_ema" with the loss-spike guard; "ema_params", the EMA of the weights, with ema.decay > 0: train/ema.py;
"extra", the objective's extra state, when it has one: read by the loss, not differentiated, updated by the
objective after each applied step).
All randomness of step s comes from fold_in(seed key, s), so a resumed run replays exactly the same dropout and
mixup masks (and MAE's patch masks) as an uninterrupted one.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from vit_jax.train.ema import EMA_PARAMS, ema_update, init_ema
from vit_jax.train.objectives import Objective


def init_state(params: Any, tx: optax.GradientTransformation, rng_key_data: jax.Array,
               loss_spike_guard: bool = False, ema: bool = False) -> dict[str, Any]:
    """`rng_key_data`: raw key data (uint32) of the training key; stored so a checkpoint is self-contained.
    `loss_spike_guard`: also keep the running average of the loss the spike guard compares with. `ema`: also keep
    an EMA of the parameters (train/ema.py), starting as their copy."""
    state = {
        "params": params,
        "opt_state": tx.init(params),
        "step": jnp.zeros((), jnp.int32),
        "rng": rng_key_data,
        "skipped": jnp.zeros((), jnp.int32),
        "consecutive_skips": jnp.zeros((), jnp.int32),
    }
    if loss_spike_guard:
        state["loss_ema"] = jnp.zeros((), jnp.float32)
    if ema:
        state[EMA_PARAMS] = init_ema(params)
    return state


def make_train_step(objective: Objective, tx: optax.GradientTransformation, schedule: Callable, *,
                    micro_batches: int = 1, loss_spike_factor: float = 0.0, ema_decay: float = 0.0) -> Callable:
    """The train step of `objective` (train/objectives/: it brings the model, the loss and any extra state). `loss_spike_factor` > 0
    also skips a step whose loss exceeds that many times the running average of the accepted losses (the state then
    carries `loss_ema`: see init_state). `ema_decay` > 0: the state's EMA of the parameters follows each applied
    step (init_state(ema=True))."""
    aux_fn = objective.loss_aux  # the loss returns (loss, aux) for update_extra (e.g. DINO's teacher centre)
    value_and_grad = jax.value_and_grad(objective.loss, has_aux=aux_fn)

    def grad_fn(*args):  # -> ((loss, aux or None), grads)
        out, grads = value_and_grad(*args)
        return (out if aux_fn else (out, None)), grads

    def train_step(state, batch):
        params, extra = state["params"], state.get("extra")
        key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
        inputs = objective.inputs(batch, key)  # of the global batch: per-example randomness ignores the split
        if micro_batches == 1:
            (loss, aux), grads = grad_fn(params, inputs, key, extra)
        else:
            # Example j of micro-batch i is row j * n + i: every micro-batch spans all devices' shards evenly.
            def split(x):
                return jnp.swapaxes(x.reshape(x.shape[0] // micro_batches, micro_batches, *x.shape[1:]), 0, 1)

            def body(acc, xs):
                i, mb_inputs = xs
                (loss_i, aux_i), grads_i = grad_fn(params, mb_inputs, jax.random.fold_in(key, i), extra)
                return jax.tree.map(jnp.add, acc, (loss_i, aux_i, grads_i)), None

            aux_shape = (jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: split(x)[0], inputs), key, extra)[0][1]
                         if aux_fn else None)
            zeros = (jnp.zeros((), jnp.float32), jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), aux_shape),
                     jax.tree.map(jnp.zeros_like, params))
            (loss, aux, grads), _ = jax.lax.scan(body, zeros,
                                                 (jnp.arange(micro_batches), jax.tree.map(split, inputs)))
            loss, aux, grads = jax.tree.map(lambda x: x / micro_batches, (loss, aux, grads))
        grad_norm = optax.tree.norm(grads)
        updates, new_opt_state = tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
        new_param_norm = optax.tree.norm(new_params)
        # The guard: a step is applied only if its loss, gradients, update and resulting parameters are all finite
        # (parameters can overflow to inf, or their norm can, from finite gradients under a huge learning rate),
        # and, with loss_spike_factor, if its loss is not a spike over the recent average.
        finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.tree.norm(updates))
                  & jnp.isfinite(new_param_norm))
        if loss_spike_factor:
            ema = state["loss_ema"]
            finite &= (ema == 0) | (loss <= loss_spike_factor * ema)

        def keep_if_finite(new, old):  # NaN/Inf guard: a bad step leaves params and optimizer state untouched
            return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)

        new_params = keep_if_finite(new_params, params)
        skipped = state["skipped"] + (~finite).astype(jnp.int32)
        new_state = {
            "params": new_params,
            "opt_state": keep_if_finite(new_opt_state, state["opt_state"]),
            "step": state["step"] + 1,
            "rng": state["rng"],
            "skipped": skipped,
            "consecutive_skips": jnp.where(finite, 0, state["consecutive_skips"] + 1),
        }
        if extra is not None:  # e.g. an EMA teacher follows the applied update; a skipped step leaves it
            updated = (objective.update_extra(extra, new_params, new_state["step"], aux) if aux_fn
                       else objective.update_extra(extra, new_params, new_state["step"]))
            new_state["extra"] = keep_if_finite(updated, extra)
        if ema_decay:  # the EMA of the weights follows the applied update; a skipped step leaves it
            new_state[EMA_PARAMS] = keep_if_finite(ema_update(state[EMA_PARAMS], new_params, ema_decay),
                                                   state[EMA_PARAMS])
        if loss_spike_factor:  # the average the next step's loss is compared with (skipped steps do not count)
            ema = state["loss_ema"]
            new_state["loss_ema"] = jnp.where(finite, jnp.where(ema == 0, loss, 0.9 * ema + 0.1 * loss), ema)
        metrics = {
            "loss": loss,
            "grad_norm": grad_norm,
            "param_norm": jnp.where(finite, new_param_norm, optax.tree.norm(params)),
            # Skipped steps do not advance optax's counters, so the schedule position is step - skipped.
            "lr": schedule(state["step"] - state["skipped"]),
            "finite": finite,
            "skipped": skipped,
            "consecutive_skips": new_state["consecutive_skips"],
        }
        return new_state, metrics

    return train_step
