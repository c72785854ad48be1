"""Transformer building blocks in Flax NNX, with logical sharding axes on every parameter.

Randomness (dropout, stochastic depth) is passed in as explicit keys rather than NNX Rngs state, so a block is a pure
function of (params, inputs, key): the encoder can scan and rematerialise it with plain `jax.lax.scan` /
`jax.checkpoint`, and the same key gives the same masks whatever the layout (scan or unrolled).

Logical axes used here (mapped to mesh axes by vit_jax.parallel): embed, mlp, heads, kv, vocab, layers; `None` and
"norm" stay replicated.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_jax.models import attention_cpu, attention_impl, attention_splash
from vit_jax.models import windows as W
from vit_jax.models.sharding_hints import constrain

TOKENS = ("batch", "seq", "act_embed")  # (B, T, D) activations: sharded over the batch only

LN_EPS = 1e-6  # the official ViT code's LayerNorm epsilon (flax default)

# What jax.checkpoint saves under each remat name of models/config.py REMAT_POLICIES ("none": no checkpointing), for
# a ViT's blocks and a BiT's bottleneck units alike.
SAVED_UNDER_REMAT = {
    "full": None,  # save nothing: recompute the whole block in the backward pass
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def param(rngs: nnx.Rngs | None, init, shape, dtype, axes) -> nnx.Param:
    """A parameter carrying its logical sharding axes as `logical_axes` metadata."""
    assert len(axes) == len(shape), (shape, axes)
    key = rngs.params() if rngs is not None else jax.random.key(0)
    return nnx.Param(init(key, shape, dtype), logical_axes=tuple(axes))


def xavier_uniform_flat(n_in_dims: int):
    """Xavier-uniform over the kernel flattened to (prod(in dims), prod(out dims)), as linen's DenseGeneral does."""

    def init(key, shape, dtype):
        fan_in = int(np.prod(shape[:n_in_dims]))
        fan_out = int(np.prod(shape[n_in_dims:]))
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return jax.random.uniform(key, shape, dtype, -limit, limit)

    return init


def lecun_normal(n_in_dims: int):
    def init(key, shape, dtype):
        fan_in = int(np.prod(shape[:n_in_dims]))
        # truncated normal with the variance of a unit normal, like jax.nn.initializers.lecun_normal
        std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
        return std * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)

    return init


def zeros(key, shape, dtype):
    del key
    return jnp.zeros(shape, dtype)


def ones(key, shape, dtype):
    del key
    return jnp.ones(shape, dtype)


def normal(stddev: float):
    def init(key, shape, dtype):
        return stddev * jax.random.normal(key, shape, dtype)

    return init


def constant(value: float):
    def init(key, shape, dtype):
        del key
        return jnp.full(shape, value, dtype)

    return init


def gelu(x: jax.Array, kind: str) -> jax.Array:
    return jax.nn.gelu(x, approximate=(kind == "tanh"))


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; a no-op when `key` is None (evaluation) or the rate is 0."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def drop_path(x: jax.Array, rate, key: jax.Array | None) -> jax.Array:
    """Stochastic depth: drops the whole residual branch per example. `rate` may be traced (scanned blocks)."""
    if key is None:
        return x
    keep_prob = 1.0 - rate
    keep = jax.random.bernoulli(key, keep_prob, (x.shape[0],) + (1,) * (x.ndim - 1))
    return jnp.where(keep, x / keep_prob, 0).astype(x.dtype)


@jax.custom_vjp
def _matmul_row_major_grads(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x (M, in) @ kernel (in, out), whose kernel gradient XLA:CPU can hand to YNNPACK.

    XLA:CPU runs a dot on YNNPACK only as a plain row-major product (lhs contracted on its last axis). Autodiff's
    kernel gradient x^T @ dy contracts both operands' leading axes, so XLA gives it to Eigen, after copying dy
    transposed anyway: 1.3-1.4x slower on a ViT-S/16 MLP's shapes. Here it is (dy^T @ x)^T: dy^T is the same copy, the
    product is plain and the final transpose is kernel-sized. The optimization barriers keep XLA from folding the
    transposes back into the dot's dimension numbers. Same sums, so the same gradient up to summation order.
    """
    return x @ kernel


def _matmul_fwd(x, kernel):
    return x @ kernel, (x, kernel)


def _matmul_bwd(residuals, dy):
    x, kernel = residuals
    barrier = jax.lax.optimization_barrier
    return dy @ kernel.T, barrier(barrier(dy.T) @ x).T


_matmul_row_major_grads.defvjp(_matmul_fwd, _matmul_bwd)


def _dense(x: jax.Array, kernel: jax.Array) -> jax.Array:
    return jnp.einsum("...i,io->...o", x, kernel)


def _cpu_dense(x: jax.Array, kernel: jax.Array) -> jax.Array:
    y = _matmul_row_major_grads(x.reshape(-1, x.shape[-1]), kernel)
    return y.reshape(*x.shape[:-1], kernel.shape[1])


class Linear(nnx.Module):
    """y = x @ kernel + bias over the last axis; kernel (in, out)."""

    def __init__(self, din: int, dout: int, axes: tuple, *, kernel_init, bias_init=zeros, param_dtype, rngs):
        self.kernel = param(rngs, kernel_init, (din, dout), param_dtype, axes)
        self.bias = param(rngs, bias_init, (dout,), param_dtype, axes[1:])

    def __call__(self, x: jax.Array) -> jax.Array:
        # Chosen when lowering, for the platform compiled for (a TPU program compiled on a CPU host included).
        y = jax.lax.platform_dependent(x, self.kernel[...].astype(x.dtype), cpu=_cpu_dense, default=_dense)
        return y + self.bias[...].astype(x.dtype)


class PatchEmbed(nnx.Module):
    """A (ph, pw, in, D) convolution with stride = patch size (the official layout and computation).

    A convolution rather than a matmul on `patchify`'s flattened patches (the same sums): XLA:CPU lays out the
    matmul's kernel gradient with the output's gradient transposed and fuses that transpose into the loop that sums
    the residual stream's gradient over every block, which then reads all its inputs strided: 12 of 63 ms of the
    demo model's train step (width 64, 4 blocks, 4x4 patches, batch 128). The convolution's gradient has no such
    transpose: 49 ms. ViT-S/16's step is the same either way (6.54 vs 6.56 s at batch 32).
    """

    def __init__(self, patch_size: tuple[int, int], cin: int, dim: int, *, param_dtype, rngs):
        self.kernel = param(rngs, lecun_normal(3), (*patch_size, cin, dim), param_dtype, (None, None, None, "embed"))
        self.bias = param(rngs, zeros, (dim,), param_dtype, ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        ph, pw, _, d = self.kernel.shape
        y = jax.lax.conv_general_dilated(x, self.kernel[...].astype(x.dtype), (ph, pw), "VALID",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y.reshape(y.shape[0], -1, d) + self.bias[...].astype(x.dtype)  # (B, gh*gw, D), row-major grid


def patchify(x: jax.Array, patch_size: tuple[int, int]) -> jax.Array:
    """(B, H, W, C) -> (B, gh*gw, ph*pw*C): patches in row-major grid order, each flattened as (ph, pw, C).

    The one patch layout of the package: the patch embedding reads it, MAE reconstructs it."""
    ph, pw = patch_size
    b, h, w, c = x.shape
    gh, gw = h // ph, w // pw
    return x.reshape(b, gh, ph, gw, pw, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, gh * gw, ph * pw * c)


class LayerNorm(nnx.Module):
    """LayerNorm with statistics in float32 whatever the compute dtype (bf16 variance underflows)."""

    def __init__(self, dim: int, *, param_dtype, rngs, eps: float = LN_EPS):
        self.scale = param(rngs, ones, (dim,), param_dtype, ("norm",))
        self.bias = param(rngs, zeros, (dim,), param_dtype, ("norm",))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        mean = xf.mean(-1, keepdims=True)
        var = jnp.square(xf - mean).mean(-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(x.dtype)


class HeadProjection(nnx.Module):
    """Query/key/value projection: kernel (embed, heads, head_dim), bias (heads, head_dim) — the official layout."""

    def __init__(self, dim: int, heads: int, *, param_dtype, rngs):
        self.kernel = param(rngs, xavier_uniform_flat(1), (dim, heads, dim // heads), param_dtype,
                            ("embed", "heads", "kv"))
        self.bias = param(rngs, zeros, (heads, dim // heads), param_dtype, ("heads", "kv"))

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jnp.einsum("btd,dhk->bthk", x, self.kernel[...].astype(x.dtype)) + self.bias[...].astype(x.dtype)
        return constrain(y, ("batch", "seq", "heads", "kv"))

    def heads_first(self, x: jax.Array) -> jax.Array:
        """(B, T, D) -> (B, heads, T, head_dim): the layout the attention matmuls batch over, with no transposes."""
        y = jnp.einsum("btd,dhk->bhtk", x, self.kernel[...].astype(x.dtype))
        y = y + self.bias[...].astype(x.dtype)[:, None, :]
        return constrain(y, ("batch", "heads", "seq", "kv"))


class OutProjection(nnx.Module):
    """Attention output projection: kernel (heads, head_dim, embed), bias (embed,)."""

    def __init__(self, dim: int, heads: int, *, param_dtype, rngs):
        self.kernel = param(rngs, xavier_uniform_flat(2), (heads, dim // heads, dim), param_dtype,
                            ("heads", "kv", "embed"))
        self.bias = param(rngs, zeros, (dim,), param_dtype, ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.einsum("bthk,hkd->btd", x, self.kernel[...].astype(x.dtype)) + self.bias[...].astype(x.dtype)

    def heads_first(self, x: jax.Array) -> jax.Array:
        """(B, heads, T, head_dim) -> (B, T, D)."""
        return jnp.einsum("bhtk,hkd->btd", x, self.kernel[...].astype(x.dtype)) + self.bias[...].astype(x.dtype)


def _attention_heads_first(q, k, v) -> jax.Array:
    """Softmax attention over (B, heads, T, head_dim) inputs, returning the same layout.

    The kernel is chosen per platform when lowering (attention_impl.py, from `model.attention`): one program traced
    on a CPU host compiles for a TPU with splash and runs on the CPU with this package's kernel. XLA's own ops are
    written in this layout because it is the one the batched matmuls want: on CPU that saves transposes of q, k, v
    and the output in both passes (~8% of a ViT-S/16 train step). Logits and softmax are float32 whatever the
    compute dtype, as in `jax.nn.dot_product_attention`.
    """
    requested = attention_impl.current()
    shapes = dict(q_tokens=q.shape[2], kv_tokens=k.shape[2], dtype=q.dtype, head_dim=q.shape[-1])
    chosen = {p: attention_impl.choose(requested, p, **shapes)[0] for p in ("cpu", "tpu", "gpu")}
    if k.shape != v.shape:
        chosen = dict.fromkeys(chosen, "xla")
    kernels = {"xla": _xla_attention, "cudnn": _cudnn_attention, "cpu": attention_cpu.attention,
               "splash": attention_splash.attention}
    if len(set(chosen.values())) == 1 and chosen["cpu"] != "splash":
        return kernels[chosen["cpu"]](q, k, v)
    splash_cpu = functools.partial(attention_splash.attention, interpret=True)  # Pallas's TPU interpret mode
    return jax.lax.platform_dependent(
        q, k, v, cpu=splash_cpu if chosen["cpu"] == "splash" else kernels[chosen["cpu"]],
        tpu=kernels[chosen["tpu"]], cuda=kernels[chosen["gpu"]], rocm=kernels[chosen["gpu"]], default=_xla_attention)


def _cudnn_attention(q, k, v) -> jax.Array:
    """cuDNN's fused flash-attention kernel; shapes or cuDNN versions it rejects while tracing take XLA's ops."""
    try:
        out = jax.nn.dot_product_attention(*(jnp.swapaxes(a, 1, 2) for a in (q, k, v)), implementation="cudnn")
        return jnp.swapaxes(out, 1, 2)
    except (ValueError, NotImplementedError, RuntimeError, TypeError):
        return _xla_attention(q, k, v)


def _xla_attention(q, k, v) -> jax.Array:
    logits_dtype = jnp.promote_types(q.dtype, jnp.float32)
    # 16-bit inputs with float32 logits: an explicit precision keeps the backward pass's dtypes consistent (the same
    # choice as jax.nn.dot_product_attention); backends that lack that algorithm use the default.
    presets = {jnp.dtype(jnp.bfloat16): jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
               jnp.dtype(jnp.float16): jax.lax.DotAlgorithmPreset.F16_F16_F32}
    precision = presets.get(jnp.dtype(q.dtype))
    try:
        logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=precision, preferred_element_type=logits_dtype)
    except Exception:  # noqa: BLE001 - the algorithm preset is not available on this backend
        logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=logits_dtype)
    probs = jax.nn.softmax(logits * (1.0 / math.sqrt(q.shape[-1])), axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v)


def attention(q, k, v, *, dropout_rate: float = 0.0, key=None, return_weights: bool = False):
    """Scaled dot-product attention over (batch, time, heads, head_dim) inputs.

    The common path is `_attention_heads_first` (cuDNN's fused kernel on GPU in 16-bit, XLA elsewhere).
    The explicit softmax path is used when the weights are wanted (analyses) or attention dropout is active, which
    the fused kernel cannot do.
    """
    if not return_weights and (key is None or dropout_rate == 0.0):
        out = _attention_heads_first(*(jnp.swapaxes(a, 1, 2) for a in (q, k, v)))
        return jnp.swapaxes(out, 1, 2), None
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    weights = jax.nn.softmax(logits, axis=-1)
    probs = dropout(weights, dropout_rate, key).astype(v.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    return out, (weights if return_weights else None)


class MultiHeadAttention(nnx.Module):
    def __init__(self, dim: int, heads: int, *, param_dtype, rngs):
        self.query = HeadProjection(dim, heads, param_dtype=param_dtype, rngs=rngs)
        self.key = HeadProjection(dim, heads, param_dtype=param_dtype, rngs=rngs)
        self.value = HeadProjection(dim, heads, param_dtype=param_dtype, rngs=rngs)
        self.out = OutProjection(dim, heads, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x_q, x_kv, *, dropout_rate=0.0, key=None, return_weights=False):
        if not return_weights and (key is None or dropout_rate == 0.0):
            q, k, v = self.query.heads_first(x_q), self.key.heads_first(x_kv), self.value.heads_first(x_kv)
            return self.out.heads_first(_attention_heads_first(q, k, v)), None
        out, weights = attention(self.query(x_q), self.key(x_kv), self.value(x_kv), dropout_rate=dropout_rate,
                                 key=key, return_weights=return_weights)
        return self.out(out), weights

    def on_grid(self, x, grid: tuple[int, int], window: int, rel_pos=None, *, dropout_rate=0.0, key=None,
                return_weights=False):
        """Self-attention of (B, gh*gw, D) tokens laid out on `grid`: inside windows when `window` > 0 (the grid
        padded to a multiple of it), with the decomposed relative position bias when `rel_pos` = (table_h, table_w).
        Windows are folded into the batch axis, so they shard over the batch (and heads) like any other attention.
        """
        b, t, d = x.shape
        x = x.reshape(b, *grid, d)
        if window:
            x, padded = W.window_partition(x, window)
        size = x.shape[1:3]
        x = x.reshape(-1, size[0] * size[1], d)
        q, k, v = self.query.heads_first(x), self.key.heads_first(x), self.value.heads_first(x)
        bias = W.rel_pos_bias(q, *rel_pos, size) if rel_pos is not None else None
        drop = (lambda w: dropout(w, dropout_rate, key)) if key is not None and dropout_rate else None
        if bias is None and drop is None and not return_weights:  # no bias: a fused kernel can take it
            out, weights = _attention_heads_first(q, k, v), None
        else:
            out, weights = W.biased_attention(q, k, v, bias, dropout_fn=drop, return_weights=return_weights)
        y = self.out.heads_first(out).reshape(-1, *size, d)
        if window:
            y = W.window_unpartition(y, window, padded, grid)
        return y.reshape(b, t, d), weights


class RelPosTables(nnx.Module):
    """The decomposed relative position tables of one block: `h` (2*S_h-1, head_dim) and `w` (2*S_w-1, head_dim)."""

    def __init__(self, size: tuple[int, int], head_dim: int, *, param_dtype, rngs):
        # Zeros as in SAM: a block starts without positional preference and learns it.
        self.h = param(rngs, zeros, (2 * size[0] - 1, head_dim), param_dtype, (None, "kv"))
        self.w = param(rngs, zeros, (2 * size[1] - 1, head_dim), param_dtype, (None, "kv"))

    def tables(self) -> tuple[jax.Array, jax.Array]:
        return self.h[...], self.w[...]


class Mlp(nnx.Module):
    """Dense -> GELU -> dropout -> Dense -> dropout (the official MlpBlock)."""

    def __init__(self, dim: int, mlp_dim: int, *, param_dtype, rngs):
        self.fc1 = Linear(dim, mlp_dim, ("embed", "mlp"), kernel_init=xavier_uniform_flat(1),
                          bias_init=normal(1e-6), param_dtype=param_dtype, rngs=rngs)
        self.fc2 = Linear(mlp_dim, dim, ("mlp", "embed"), kernel_init=xavier_uniform_flat(1),
                          bias_init=normal(1e-6), param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x, *, gelu_kind: str, dropout_rate: float = 0.0, keys=(None, None)):
        x = constrain(self.fc1(x), ("batch", "seq", "mlp"))
        x = dropout(gelu(x, gelu_kind), dropout_rate, keys[0])
        return dropout(self.fc2(x), dropout_rate, keys[1])


class SwiGLU(nnx.Module):
    """DINOv2's SwiGLU feed-forward (its ViT-g): fc2(silu(gate(x)) * value(x)), then dropout.

    DINOv2 and timm pack gate and value into one (2*mlp, embed) weight ([x1; x2] = w12(x)); here they are two
    Linears, so that sharding the hidden axis over the tensor axis keeps each gate unit on the shard of its value
    unit (checkpoints/timm_blocks.py splits and packs the timm weight)."""

    def __init__(self, dim: int, mlp_dim: int, *, param_dtype, rngs):
        def linear(din, dout, axes):
            return Linear(din, dout, axes, kernel_init=xavier_uniform_flat(1), bias_init=zeros,
                          param_dtype=param_dtype, rngs=rngs)

        self.gate = linear(dim, mlp_dim, ("embed", "mlp"))
        self.value = linear(dim, mlp_dim, ("embed", "mlp"))
        self.fc2 = linear(mlp_dim, dim, ("mlp", "embed"))

    def __call__(self, x, *, gelu_kind: str = "", dropout_rate: float = 0.0, keys=(None, None)):
        del gelu_kind  # the gate is SiLU whatever the GELU setting
        h = jax.nn.silu(self.gate(x)) * self.value(x)
        h = dropout(constrain(h, ("batch", "seq", "mlp")), dropout_rate, keys[0])
        return dropout(self.fc2(h), dropout_rate, keys[1])


class LayerScale(nnx.Module):
    """CaiT's LayerScale, as DINOv2 uses it: a learned per-channel gamma multiplying a residual branch."""

    def __init__(self, dim: int, init_value: float, *, param_dtype, rngs):
        self.gamma = param(rngs, constant(init_value), (dim,), param_dtype, ("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.gamma[...].astype(x.dtype)


class EncoderBlock(nnx.Module):
    """Pre-LayerNorm Transformer block: x + MHSA(LN(x)), then x + MLP(LN(x)); with `layer_scale` > 0 each branch is
    multiplied by its LayerScale gamma (ls1, ls2) before the residual sum, and `ffn='swiglu'` swaps the MLP."""

    def __init__(self, dim: int, mlp_dim: int, heads: int, *, param_dtype, rngs, ln_eps: float = LN_EPS,
                 layer_scale: float = 0.0, ffn: str = "mlp"):
        self.ln1 = LayerNorm(dim, param_dtype=param_dtype, rngs=rngs, eps=ln_eps)
        self.attn = MultiHeadAttention(dim, heads, param_dtype=param_dtype, rngs=rngs)
        self.ln2 = LayerNorm(dim, param_dtype=param_dtype, rngs=rngs, eps=ln_eps)
        self.mlp = (SwiGLU if ffn == "swiglu" else Mlp)(dim, mlp_dim, param_dtype=param_dtype, rngs=rngs)
        scale = (lambda: LayerScale(dim, layer_scale, param_dtype=param_dtype, rngs=rngs)) if layer_scale else None
        self.ls1 = scale() if scale else None
        self.ls2 = scale() if scale else None

    def __call__(self, x, *, gelu_kind: str, dropout_rate=0.0, attention_dropout=0.0, drop_path_rate=0.0,
                 key=None, return_weights=False, grid=None, window=0, rel_pos=None):
        """`grid` set: attention on the patch grid (see MultiHeadAttention.on_grid), else over the flat sequence."""
        keys = list(jax.random.split(key, 6)) if key is not None else [None] * 6
        x = constrain(x, TOKENS)
        use_drop_path = not (isinstance(drop_path_rate, (int, float)) and drop_path_rate == 0.0)
        y = self.ln1(x)
        if grid is not None:
            y, weights = self.attn.on_grid(y, grid, window, rel_pos, dropout_rate=attention_dropout, key=keys[0],
                                           return_weights=return_weights)
        else:
            y, weights = self.attn(y, y, dropout_rate=attention_dropout, key=keys[0], return_weights=return_weights)
        y = dropout(y, dropout_rate, keys[1])
        y = self.ls1(y) if self.ls1 is not None else y
        x = x + (drop_path(y, drop_path_rate, keys[2]) if use_drop_path else y)
        y = self.mlp(self.ln2(x), gelu_kind=gelu_kind, dropout_rate=dropout_rate, keys=(keys[3], keys[4]))
        y = self.ls2(y) if self.ls2 is not None else y
        x = x + (drop_path(y, drop_path_rate, keys[5]) if use_drop_path else y)
        return constrain(x, TOKENS), weights


class MAPHead(nnx.Module):
    """Multihead attention pooling: a learned probe attends over the tokens, followed by a residual MLP."""

    def __init__(self, dim: int, mlp_dim: int, heads: int, *, param_dtype, rngs):
        self.probe = param(rngs, xavier_uniform_flat(2), (1, 1, dim), param_dtype, (None, None, "embed"))
        self.attn = MultiHeadAttention(dim, heads, param_dtype=param_dtype, rngs=rngs)
        self.ln = LayerNorm(dim, param_dtype=param_dtype, rngs=rngs)
        self.mlp = Mlp(dim, mlp_dim, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x, *, gelu_kind: str):
        probe = jnp.broadcast_to(self.probe[...].astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
        x, _ = self.attn(probe, x)
        x = x + self.mlp(self.ln(x), gelu_kind=gelu_kind)
        return x[:, 0]


class Neck(nnx.Module):
    """SAM's neck on a (B, H, W, D) map: 1x1 conv (no bias) -> LayerNorm2d -> 3x3 conv (no bias) -> LayerNorm2d.

    SAM's LayerNorm2d normalises over the channels of every position with eps 1e-6: in NHWC that is LayerNorm.
    """

    def __init__(self, dim: int, out_dim: int, *, param_dtype, rngs):
        self.conv1 = param(rngs, lecun_normal(3), (1, 1, dim, out_dim), param_dtype, (None, None, "embed", None))
        self.ln1 = LayerNorm(out_dim, param_dtype=param_dtype, rngs=rngs)
        self.conv2 = param(rngs, lecun_normal(3), (3, 3, out_dim, out_dim), param_dtype, (None, None, None, None))
        self.ln2 = LayerNorm(out_dim, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.ln1(jnp.einsum("bhwc,co->bhwo", x, self.conv1[0, 0].astype(x.dtype)))
        x = jax.lax.conv_general_dilated(x, self.conv2[...].astype(x.dtype), (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return self.ln2(x)
