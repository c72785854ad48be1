"""model.attention: splash attention (Pallas, interpret mode on CPU) against XLA's attention, the choice per platform,
refusals, and a training run that names and uses the kernel it was given."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.train.test_step import DUR, batch, run, tiny_config
from vit_jax.models import attention_impl, attention_splash, layers
from vit_jax.models.config import ModelConfigError, ViTConfig
from vit_jax.train.program import build_program


def _qkv(tokens: int, heads: int = 2, head_dim: int = 16, batch_size: int = 2, seed: int = 0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(k, (batch_size, heads, tokens, head_dim), jnp.float32) for k in keys)


# 197: ViT-B/16 at 224 with its class token; 257: a 16x16 grid + class token; 1,025: 32x32 + class token; 49: one
# 7x7 window. Each pads to a multiple of 128 and masks the padded keys.
@pytest.mark.parametrize("tokens", [49, 197, 257, 1025])
def test_splash_forward_and_backward_equal_xla_attention(tokens):
    q, k, v = _qkv(tokens, head_dim=8 if tokens == 1025 else 16, batch_size=1 if tokens == 1025 else 2)
    probe = jax.random.normal(jax.random.key(9), q.shape)  # a loss that weights every output differently

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * probe)

    splash = jax.jit(jax.value_and_grad(loss(lambda *a: attention_splash.attention(*a, interpret=True)), (0, 1, 2)))
    xla = jax.jit(jax.value_and_grad(loss(layers._xla_attention), (0, 1, 2)))
    (ls, gs), (lx, gx) = splash(q, k, v), xla(q, k, v)
    np.testing.assert_allclose(attention_splash.attention(q, k, v, interpret=True), layers._xla_attention(q, k, v),
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(ls, lx, rtol=1e-5)
    for a, b in zip(gs, gx):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_cross_attention_of_another_length_equals_xla():
    q, _, _ = _qkv(130)
    _, k, v = _qkv(200, seed=1)
    np.testing.assert_allclose(attention_splash.attention(q, k, v, interpret=True), layers._xla_attention(q, k, v),
                               atol=1e-5, rtol=0)


def test_auto_picks_per_platform_and_says_why():
    def pick(name, platform, tokens=197, dtype=jnp.bfloat16, head_dim=64):
        return attention_impl.choose(name, platform, q_tokens=tokens, kv_tokens=tokens, dtype=dtype,
                                     head_dim=head_dim)

    assert pick("auto", "tpu")[0] == "splash" and pick("auto", "tpu", tokens=127)[0] == "xla"
    assert pick("auto", "tpu", tokens=128)[0] == "splash"
    assert pick("auto", "cuda", tokens=1370) == ("cudnn", "auto: cuDNN's constraints hold")
    impl, why = pick("cudnn", "gpu")  # 197 tokens: cuDNN's backward refuses odd lengths (seen on an H100)
    assert impl == "xla" and "even token counts" in why and "197x197" in why
    impl, why = pick("auto", "gpu", dtype=jnp.float32)
    assert impl == "xla" and "bfloat16 or float16" in why
    impl, why = pick("auto", "gpu", head_dim=72 + 60)
    assert impl == "xla" and "head dimension" in why and "132" in why
    assert pick("auto", "cpu", dtype=jnp.float32)[0] == "cpu"
    assert pick("splash", "cpu")[0] == "splash" and "interpret" in pick("splash", "cpu")[1]
    assert pick("xla", "tpu") == ("xla", "requested")
    # A kernel the platform lacks (a checkpoint trained elsewhere) lowers to that platform's own choice.
    assert pick("cudnn", "tpu")[0] == "splash" and pick("splash", "gpu", tokens=256)[0] == "cudnn"


@pytest.mark.parametrize("name, platform, dtype, head_dim, message", [
    ("cudnn", "cpu", "bfloat16", 64, "runs on gpu, not on cpu"),
    ("cpu", "tpu", "float32", 64, "runs on cpu, not on tpu"),
    ("splash", "gpu", "bfloat16", 64, "runs on tpu or cpu, not on gpu"),
    ("cudnn", "gpu", "float32", 64, "needs bfloat16 or float16"),
    ("cudnn", "gpu", "bfloat16", 12, "divisible by 8"),
    ("cpu", "cpu", "bfloat16", 64, "computes in float32"),
])
def test_a_kernel_the_platform_or_model_cannot_run_is_refused_in_one_line(name, platform, dtype, head_dim, message):
    with pytest.raises(ModelConfigError, match=message) as e:
        attention_impl.check(name, platform, dtype=dtype, head_dim=head_dim)
    assert "\n" not in str(e.value)


def test_an_unknown_implementation_is_a_config_error():
    with pytest.raises(ModelConfigError, match="attention='flash' is not one of"):
        ViTConfig(attention="flash")


def test_training_with_splash_gives_xla_losses_on_a_data_fsdp_mesh_and_the_run_names_it():
    # 32 px, patch 4: 64 patches + class token = 65 tokens (padded to 128), on a 2 x 2 mesh: per_shard runs the
    # kernel on each device's examples. The first step's learning rate is 0 (warm-up) and the head starts at zero: the last two of 4 steps show
    # the updates.
    batches = [batch(16, seed=s) for s in range(4)]
    batches = [{**b, "image": jax.image.resize(b["image"], (16, 32, 32, 3), "nearest")} for b in batches]
    results = {}
    for name in ("xla", "splash"):
        c = tiny_config(**{"model.attention": name, "model.image_size": 32, "mesh.data": 2, "mesh.fsdp": 2})
        results[name] = [float(m["loss"]) for m in run(c, batches, devices=jax.devices()[:4])[1]]
    np.testing.assert_allclose(results["splash"], results["xla"], rtol=0, atol=1e-5)
    assert len(set(results["xla"])) == 3  # the parameters changed between the last steps
    prog = build_program(tiny_config(**{"model.attention": "splash"}), 5, DUR, devices=jax.devices()[:1])
    assert prog.attention == {"requested": "splash", "used": "splash",
                              "why": "requested (Pallas interpret mode on CPU)"}
    with pytest.raises(ModelConfigError, match="runs on gpu, not on cpu"):
        build_program(tiny_config(**{"model.attention": "cudnn"}), 5, DUR, devices=jax.devices()[:1])


def test_splash_is_not_chosen_for_tpu_v2_or_v3():
    """Mosaic has no bf16 matmul there: the TPU compiler refused splash for a v3 slice."""
    shapes = dict(q_tokens=197, kv_tokens=197, dtype=jnp.bfloat16, head_dim=64)
    with attention_impl.lowering_for("TPU v3"):
        impl, why = attention_impl.choose("auto", "tpu", **shapes)
        assert impl == "xla" and "TPU v4 and newer, not TPU v3" in why
        assert attention_impl.choose("splash", "tpu", **shapes)[0] == "xla"
    with attention_impl.lowering_for("TPU v5 lite"):
        assert attention_impl.choose("auto", "tpu", **shapes)[0] == "splash"
    with pytest.raises(ModelConfigError, match="not TPU v2"):
        attention_impl.check("splash", "tpu", dtype="bfloat16", head_dim=64, device_kind="TPU v2")
    attention_impl.check("auto", "tpu", dtype="bfloat16", head_dim=64, device_kind="TPU v3")  # auto falls back
