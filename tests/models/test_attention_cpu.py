"""The CPU attention kernel (models/attention_cpu.py, models/_attention_cpu.cc): XLA's attention's values and
gradients, chosen when lowering for the CPU in float32 only, and run per shard under a mesh."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax.models import attention_cpu
from vit_jax.models import layers as L
from vit_jax.models.sharding_hints import activation_sharding
from vit_jax.parallel import mesh as mesh_lib


def _inputs(b, h, t, s, d, scale=1.0, seed=0):
    kq, kk, kv, kg = jax.random.split(jax.random.key(seed), 4)
    return (jax.random.normal(kq, (b, h, t, d)) * scale, jax.random.normal(kk, (b, h, s, d)),
            jax.random.normal(kv, (b, h, s, d)), jax.random.normal(kg, (b, h, t, d)))


def _value_and_grads(attention, q, k, v, g):
    return jax.jit(lambda q, k, v, g: (lambda out, vjp: (out, *vjp(g)))(*jax.vjp(attention, q, k, v)))(q, k, v, g)


def test_the_kernel_loads_on_this_machine():
    # `make install` builds it for this CPU; were it missing, attention would silently run on XLA's ops.
    assert attention_cpu.UNAVAILABLE is None and attention_cpu.enabled()


@pytest.mark.parametrize("b,h,t,s,d", [
    (2, 3, 17, 17, 8),    # rows and columns that fill no vector or register tile
    (1, 1, 1, 1, 16),     # one token
    (3, 2, 50, 50, 80),   # ViT-H's head width: 80 = 32 + 32 + 16 columns
    (2, 4, 1, 65, 24),    # cross-attention with one query (the MAP head)
    (2, 6, 197, 197, 64),  # ViT-S/16 at 224 px
])
def test_values_and_gradients_equal_xlas(b, h, t, s, d):
    q, k, v, g = _inputs(b, h, t, s, d, scale=3.0)  # peaked softmaxes: logits with a std of 3
    ours = _value_and_grads(attention_cpu.attention, q, k, v, g)
    ref = _value_and_grads(L._xla_attention, q, k, v, g)
    for name, a, r in zip(("out", "dq", "dk", "dv"), ours, ref):
        assert a.shape == r.shape and a.dtype == r.dtype == jnp.float32, name
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=2e-5, err_msg=name)


def test_saturated_softmax_stays_finite_and_exact():
    # Logits in the thousands: every exp but the row's maximum underflows to zero, in the kernel as in XLA. The
    # gradients are in the hundreds (q is scaled up), hence the relative tolerance of float32 sums of that size.
    q, k, v, g = _inputs(2, 2, 20, 20, 16, scale=300.0, seed=1)
    ours = _value_and_grads(attention_cpu.attention, q, k, v, g)
    ref = _value_and_grads(L._xla_attention, q, k, v, g)
    for a, r in zip(ours, ref):
        assert np.isfinite(np.asarray(a)).all()
        np.testing.assert_allclose(a, r, rtol=2e-4, atol=1e-4)


def test_chosen_when_lowering_for_cpu_in_float32_only():
    q = jnp.ones((2, 2, 5, 8))
    grad = jax.jit(jax.grad(lambda q: L._attention_heads_first(q, q, q).sum()))
    cpu = grad.lower(q).as_text()
    assert attention_cpu.FORWARD_TARGET in cpu and attention_cpu.BACKWARD_TARGET in cpu
    tpu = grad.trace(q).lower(lowering_platforms=("tpu",)).as_text()
    assert attention_cpu.FORWARD_TARGET not in tpu and "custom_call" not in tpu
    half = q.astype(jnp.bfloat16)
    assert attention_cpu.FORWARD_TARGET not in jax.jit(L._attention_heads_first).lower(half, half, half).as_text()
    with attention_cpu.xla_ops():
        assert attention_cpu.FORWARD_TARGET not in jax.jit(lambda q: L._attention_heads_first(q, q, q)).lower(
            q).as_text()


def test_runs_per_shard_under_a_mesh():
    # Batch over data, heads over tensor: each device's custom call sees its own (B/4, H/2) block, nothing gathered.
    mesh = mesh_lib.make_mesh(data=4, fsdp=1, tensor=2)
    q, k, v, g = _inputs(8, 4, 10, 10, 16)
    sharding = NamedSharding(mesh, P("data", "tensor"))

    def loss(q, k, v):
        with activation_sharding(mesh_lib.activation_resolver(mesh)):
            return jnp.sum(L._attention_heads_first(q, k, v) * g)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), in_shardings=(sharding,) * 3)
    text = step.lower(q, k, v).compile().as_text()
    calls = re.findall(r"= \(?f32\[([\d,]+)\].*custom_call_target=\"vit_jax_attention_(\w+)\"", text)
    assert sorted(kind for _, kind in calls) == ["backward", "forward"]
    assert all(shape == "2,2,10,16" for shape, _ in calls), calls
    assert "all-gather" not in text
    value, grads = step(*(jax.device_put(x, sharding) for x in (q, k, v)))
    ref_value, ref_grads = jax.value_and_grad(lambda q, k, v: jnp.sum(L._xla_attention(q, k, v) * g),
                                              argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for a, r in zip(grads, ref_grads):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=2e-5)


def test_vmapped_runs_one_call_per_slice():
    q, k, v, _ = _inputs(6, 2, 9, 9, 8)
    stack = lambda x: x.reshape(3, 2, *x.shape[1:])  # noqa: E731
    ours = jax.vmap(attention_cpu.attention)(stack(q), stack(k), stack(v))
    np.testing.assert_allclose(ours, stack(L._xla_attention(q, k, v)), rtol=1e-5, atol=1e-6)


def test_mismatched_operands_are_a_clear_error():
    q, k, v, _ = _inputs(1, 2, 4, 4, 8)
    with pytest.raises(Exception, match="vit_jax attention: v does not match q"):
        jax.block_until_ready(attention_cpu._forward_call(q, k, v[:, :, :3]))
