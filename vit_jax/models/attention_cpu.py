"""Softmax attention on XLA:CPU through this package's own kernel (`_attention_cpu.cc`): float32, heads-first.

XLA:CPU runs the attention's batched matmuls (one small product per batch element and head) on one thread; the
kernel spreads the (batch, head) pairs over XLA's intra-op threads and does each pair's products and softmax in
cache (issue #17, docs/BENCHMARKS.md). `layers._attention_heads_first` chooses it when lowering for the CPU only, so
TPU and GPU programs (also TPU programs compiled on a CPU host) keep XLA's ops.

The kernel is compiled for the machine that built the package. Where it cannot load (built for a CPU with vector
instructions this one lacks, or not built), `UNAVAILABLE` says why and attention stays on XLA's ops.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import jax
import numpy as np

from vit_jax.models.sharding_hints import current_resolver, per_shard

FORWARD_TARGET, BACKWARD_TARGET = "vit_jax_attention_forward", "vit_jax_attention_backward"

try:
    from vit_jax.models import _attention_cpu
except ImportError as e:
    UNAVAILABLE: str | None = f"the CPU attention kernel did not load ({e})"
else:
    UNAVAILABLE = None
    jax.ffi.register_ffi_target(FORWARD_TARGET, _attention_cpu.forward, platform="cpu")
    jax.ffi.register_ffi_target(BACKWARD_TARGET, _attention_cpu.backward, platform="cpu")

_ENABLED = contextvars.ContextVar("cpu_attention_kernel", default=True)


def enabled() -> bool:
    """Whether attention traced now takes the kernel on CPU (see `xla_ops`)."""
    return UNAVAILABLE is None and _ENABLED.get()


@contextlib.contextmanager
def xla_ops():
    """While tracing in this context, attention stays on XLA's ops on the CPU too: for A/B benchmarks, and for XLA's
    cost analysis, which counts no FLOPs inside a custom call."""
    token = _ENABLED.set(False)
    try:
        yield
    finally:
        _ENABLED.reset(token)


# q (B, heads, T, head_dim), k and v (B, heads, S, head_dim), the probabilities (B, heads, T, S): split over batch
# and heads, sequences whole.
_AXES = ("batch", "heads", None, None)


def _scale(q) -> np.float32:
    return np.float32(1.0 / math.sqrt(q.shape[-1]))


def _forward_call(q, k, v):
    results = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((*q.shape[:3], k.shape[2]), q.dtype))
    return jax.ffi.ffi_call(FORWARD_TARGET, results, vmap_method="sequential")(q, k, v, scale=_scale(q))


def _backward_call(q, k, v, probs, dout):
    results = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
    return jax.ffi.ffi_call(BACKWARD_TARGET, results, vmap_method="sequential")(q, k, v, probs, dout, scale=_scale(q))


def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(head_dim)) v: float32 q (B, heads, T, head_dim), k and v (B, heads, S, head_dim)."""
    return _attention(current_resolver(), q, k, v)


# The activation-sharding resolver is an argument so that the backward pass, traced after the forward's
# `activation_sharding` context may have closed, splits its custom call the same way.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(resolver, q, k, v):
    return _forward(resolver, q, k, v)[0]


def _forward(resolver, q, k, v):
    out, probs = per_shard(_forward_call, (_AXES,) * 3, (_AXES, _AXES), resolver)(q, k, v)
    return out, (q, k, v, probs)


def _backward(resolver, residuals, dout):
    return tuple(per_shard(_backward_call, (_AXES,) * 5, (_AXES,) * 3, resolver)(*residuals, dout))


_attention.defvjp(_forward, _backward)
