"""Softmax attention through Pallas splash attention (the TPU flash-attention kernel), for any sequence length.

Flash attention never materialises the (heads, T, T) logits: at SAM's 4,096 tokens those are 64 MiB per head and
example in float32. The kernel's rules (ANCHORS.md §6) shape this wrapper:
- it takes one example's (heads, T, head_dim), so the batch is vmapped;
- its blocks must divide the sequence and its kv compute block is a multiple of 128, so q and k/v are padded to a
  multiple of 128 and the padded keys are masked out with segment ids (padded queries attend to the real keys, which
  keeps their rows finite; their outputs are sliced away, so they get no gradient);
- it has no softmax scale, so q is pre-scaled by 1/sqrt(head_dim), and no additive bias (relative positions stay on
  XLA's ops);
- the SPMD partitioner cannot split a Pallas call, so under a mesh it runs per shard (batch and heads split,
  sequences whole), as the CPU kernel does.
On CPU it runs in Pallas's TPU interpret mode: the same kernel, slowly, for tests and small runs.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from vit_jax.models.sharding_hints import current_resolver, per_shard

BLOCK_MULTIPLE = 128  # the kernel's kv compute block must be a multiple of 128
_BLOCKS = (512, 256, 128)  # MaxText's splash blocks are 512, clamped to the sequence
_AXES = ("batch", "heads", None, None)  # q, k, v, out: (B, heads, T, head_dim)


def padded_length(tokens: int) -> int:
    return -(-tokens // BLOCK_MULTIPLE) * BLOCK_MULTIPLE


def _block(length: int) -> int:
    return next(b for b in _BLOCKS if length % b == 0)


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, q_len: int, kv_len: int, interpret: bool):
    # Imported here: the Pallas TPU package pulls in Mosaic, which programs that never choose splash need not load.
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    bq, bkv = _block(q_len), _block(kv_len)
    sizes = sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                          block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
    mask = sm.MultiHeadMask([sm.FullMask((q_len, kv_len)) for _ in range(heads)])
    # The kernel holds its mask's block tables as arrays: made concrete here, so one kernel serves every trace.
    with jax.ensure_compile_time_eval():
        kernel = sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)
    return sk, kernel


def _local_attention(q, k, v, *, interpret: bool):
    """One device's shard: q (B, heads, T, d), k and v (B, heads, S, d) -> (B, heads, T, d)."""
    t, s = q.shape[2], k.shape[2]
    pt, ps = padded_length(t), padded_length(s)
    sk, kernel = _kernel(q.shape[1], pt, ps, interpret)
    pad = lambda x, n: jnp.pad(x, ((0, 0), (0, 0), (0, n - x.shape[2]), (0, 0)))  # noqa: E731
    q = pad(q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype), pt)
    k, v = pad(k, ps), pad(v, ps)
    # Segment 0: every query and the real keys; the padded keys are segment 1, which no query attends to.
    segments = sk.SegmentIds(q=jnp.zeros((pt,), jnp.int32), kv=(jnp.arange(ps) >= s).astype(jnp.int32))
    out = jax.vmap(lambda q1, k1, v1: kernel(q1, k1, v1, segment_ids=segments))(q, k, v)
    return out[:, :, :t]


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, interpret: bool = False) -> jax.Array:
    """softmax(q k^T / sqrt(head_dim)) v over q (B, heads, T, head_dim), k and v (B, heads, S, head_dim)."""
    fn = lambda *qkv: (_local_attention(*qkv, interpret=interpret),)  # noqa: E731  (per_shard maps tuples)
    return per_shard(fn, (_AXES,) * 3, (_AXES,), current_resolver())(q, k, v)[0]
