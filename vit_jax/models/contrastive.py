"""Image-text contrastive losses over the global batch: CLIP's softmax and SigLIP's sigmoid.

Inputs are L2-normalised embeddings `zimg`, `ztxt` (n, d) where row i of each is a matching pair.

- `softmax_loss` (CLIP): logits = t * zimg @ ztxt^T; the mean of the image->text and text->image cross-entropies
  with the diagonal as the targets. Written on the global arrays: under jit with a batch-sharded mesh, GSPMD gathers
  what the (n, n) logits need.
- `sigmoid_loss` (SigLIP): logits = t * zimg @ ztxt^T + b, every pair an independent binary problem,
  L = -(1/n) sum_ij log sigmoid(z_ij * logits_ij), z = +1 on the diagonal, -1 elsewhere (the paper's Eq. 1 / Alg. 1).
  Three forms that compute the same number:
  * `sigmoid_loss`: the global arrays (GSPMD decides the communication);
  * `sigmoid_loss_sharded(..., chunked=False)`: per device, its images against all texts, all-gathered;
  * `sigmoid_loss_sharded(..., chunked=True)`: the paper's memory-light form (§3.3, Fig. 1): each device keeps its
    images and passes its texts round the ring of data-parallel devices with `ppermute`, one chunk per hop, so no
    device ever holds more than its own (b, b) block of logits or more than one foreign chunk of texts. The
    positives are in the first hop only (a device's own texts).
  Gradients flow through the collectives (the transpose of a ppermute is the reverse permutation).

The sharded forms run under `jax.shard_map` over the mesh axes that split the batch; the mesh is given by the
caller (the objective reads it from the activation-sharding resolver), so this module knows nothing of configs.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P


def softmax_loss(zimg: jax.Array, ztxt: jax.Array, t: jax.Array) -> jax.Array:
    """CLIP's symmetric cross-entropy; `t` the temperature (exp of the learned log-temperature)."""
    logits = t * jnp.einsum("id,jd->ij", zimg, ztxt)
    labels = jnp.arange(logits.shape[0])
    i2t = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, axis=1), labels[:, None], axis=1))
    t2i = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, axis=0), labels[None, :], axis=0))
    return 0.5 * (i2t + t2i)


def _pair_loss_sum(zimg: jax.Array, ztxt: jax.Array, t: jax.Array, b: jax.Array, positives: bool) -> jax.Array:
    """sum_ij -log sigmoid(z_ij * logits_ij) of one (rows of zimg) x (rows of ztxt) block; `positives`: the block
    holds the matching pairs on its diagonal (else every pair is negative)."""
    logits = t * jnp.einsum("id,jd->ij", zimg, ztxt) + b
    z = (2.0 * jnp.eye(*logits.shape) - 1.0) if positives else -jnp.ones_like(logits)
    return -jnp.sum(jax.nn.log_sigmoid(z * logits))


def sigmoid_loss(zimg: jax.Array, ztxt: jax.Array, t: jax.Array, b: jax.Array) -> jax.Array:
    """SigLIP's loss on the global arrays (normalised by the batch size n, as the paper)."""
    return _pair_loss_sum(zimg, ztxt, t, b, True) / zimg.shape[0]


def batch_axes_of(spec: P) -> tuple[str, ...]:
    """The mesh axes a PartitionSpec splits its first (batch) dimension over, as a tuple."""
    first = spec[0] if len(spec) else None
    if first is None:
        return ()
    return tuple(first) if isinstance(first, (tuple, list)) else (first,)


def sigmoid_loss_sharded(zimg: jax.Array, ztxt: jax.Array, t: jax.Array, b: jax.Array, *, mesh: Mesh,
                         batch_axes: Sequence[str], chunked: bool = True) -> jax.Array:
    """SigLIP's loss with the batch split over `batch_axes` of `mesh`: texts passed device to device (`chunked`)
    or all-gathered. Equal to `sigmoid_loss` of the same global arrays (up to float summation order)."""
    axes = tuple(batch_axes)
    if not axes:
        return sigmoid_loss(zimg, ztxt, t, b)
    devices = 1
    for a in axes:
        devices *= mesh.shape[a]
    n = zimg.shape[0]
    if n % devices:
        raise ValueError(f"a batch of {n} does not split over the {devices} devices of mesh axes {axes}")
    name = axes if len(axes) > 1 else axes[0]

    def per_device(zi, zt, t, b):
        if chunked:
            # Device k receives device k+1's texts at every hop: after hop h it holds the texts of device k+h.
            perm = [(j, (j - 1) % devices) for j in range(devices)]
            total = _pair_loss_sum(zi, zt, t, b, True)
            for _ in range(devices - 1):
                zt = jax.lax.ppermute(zt, name, perm)
                total = total + _pair_loss_sum(zi, zt, t, b, False)
        else:
            everyone = jax.lax.all_gather(zt, name, tiled=True)  # (n, d) in device order
            me = jax.lax.axis_index(name)
            rows = jnp.arange(zi.shape[0])
            logits = t * jnp.einsum("id,jd->ij", zi, everyone) + b
            z = jnp.where(jnp.arange(n)[None, :] == (me * zi.shape[0] + rows)[:, None], 1.0, -1.0)
            total = -jnp.sum(jax.nn.log_sigmoid(z * logits))
        return jax.lax.psum(total, name) / n

    return jax.shard_map(per_device, mesh=mesh, in_specs=(P(axes, None), P(axes, None), P(), P()),
                         out_specs=P())(zimg, ztxt, t, b)
