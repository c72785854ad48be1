"""Activation sharding hints by logical axis name.

The model marks a few activations with logical axes ("batch", "seq", "act_embed", "heads", "kv", "mlp"); whoever
runs it under a mesh installs a resolver that turns those names into shardings (vit_jax.parallel). Without a
resolver the hints are no-ops, so the model itself knows nothing of meshes.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import jax

_RESOLVER: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("activation_sharding", default=None)


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
    resolver = _RESOLVER.get()
    if resolver is None:
        return x
    return jax.lax.with_sharding_constraint(x, resolver(axes, x.shape))


@contextlib.contextmanager
def activation_sharding(resolver: Callable):
    """Within this context (i.e. while tracing), `constrain` applies `resolver(axes, shape) -> Sharding`."""
    token = _RESOLVER.set(resolver)
    try:
        yield
    finally:
        _RESOLVER.reset(token)
