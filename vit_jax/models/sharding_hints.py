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


def current_resolver() -> Callable | None:
    """The resolver installed by `activation_sharding`, if any (for code that must keep it past the trace, such as a
    custom VJP whose backward pass is traced after the forward's context has closed)."""
    return _RESOLVER.get()


def per_shard(fn: Callable, in_axes: tuple, out_axes: tuple, resolver: Callable | None) -> Callable:
    """`fn` run on each device's shard of its arguments, for ops the SPMD partitioner cannot split (custom calls).

    The arguments and results are laid out by their logical axes, resolved by `resolver` (see `activation_sharding`);
    an op that needs an axis whole gives it as None. Without a resolver, or on a one-device mesh, this is `fn` itself.
    """

    def run(*args):
        if resolver is None:
            return fn(*args)
        in_sh = [resolver(axes, x.shape) for axes, x in zip(in_axes, args)]
        mesh = in_sh[0].mesh
        if mesh.size == 1:
            return fn(*args)
        out_shapes = jax.eval_shape(fn, *args)
        out_specs = tuple(resolver(axes, s.shape).spec for axes, s in zip(out_axes, out_shapes))
        # check_vma off: a custom call has no rule for which mesh axes its results vary over.
        return jax.shard_map(fn, mesh=mesh, in_specs=tuple(s.spec for s in in_sh), out_specs=out_specs,
                             check_vma=False)(*args)

    return run
