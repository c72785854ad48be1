"""The losses of DINO / iBOT / DINOv2 (reference: facebookresearch/dinov2 loss/*.py), as pure functions of global
arrays: under jit over a sharded batch, a mean or sum over the batch axis is the all-reduce the reference does with
torch.distributed by hand.

- teacher targets: `centered_softmax` (DINO: softmax((t - centre) / tau)) or `sinkhorn_knopp` (DINOv2's option:
  3 iterations normalising prototypes and samples in turn, so every prototype is used equally over the batch);
- `cross_entropy`: per row -sum_k target_k log_softmax(student / tau_s)_k;
- `koleo`: the Kozachenko-Leonenko entropy estimator on L2-normalised vectors, -mean log(distance to the nearest
  other row), which spreads the class tokens of a batch (DINOv2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def centered_softmax(teacher: jax.Array, center: jax.Array, temperature: jax.Array | float) -> jax.Array:
    """DINO's teacher target: softmax((teacher - center) / temperature) over the last axis."""
    return jax.nn.softmax((teacher.astype(jnp.float32) - center) / temperature, axis=-1)


def sinkhorn_knopp(teacher: jax.Array, temperature: jax.Array | float, iterations: int = 3,
                   weights: jax.Array | None = None) -> jax.Array:
    """DINOv2's Sinkhorn-Knopp teacher target for logits (B, K): Q = exp(t / tau), normalised to sum 1, then
    `iterations` rounds of (each prototype's row to 1/K, each sample's column to 1/B), finally x B so each sample's
    target sums to 1. `weights` (B,) of 0/1 leaves rows out (iBOT: only the masked patches), B counting the others.

    The maximum logit is subtracted before the exponential: it cancels in the first normalisation, and keeps a
    small temperature from overflowing float32."""
    t = teacher.astype(jnp.float32) / temperature
    q = jnp.exp(t - jax.lax.stop_gradient(jnp.max(t)))
    w = jnp.ones(t.shape[0], jnp.float32) if weights is None else weights.astype(jnp.float32)
    q = q * w[:, None]
    n = jnp.maximum(w.sum(), 1.0)
    k = t.shape[1]
    q = q / q.sum()
    for _ in range(iterations):
        q = q / jnp.maximum(q.sum(axis=0, keepdims=True), 1e-30) / k  # every prototype carries 1/K of the mass
        q = q / jnp.maximum(q.sum(axis=1, keepdims=True), 1e-30) / n  # every (kept) sample carries 1/B
        q = q * w[:, None]
    return q * n


def cross_entropy(target: jax.Array, student: jax.Array, temperature: float) -> jax.Array:
    """Per row (..., K) -> (...): -sum_k target_k log_softmax(student / temperature)_k."""
    return -jnp.sum(target * jax.nn.log_softmax(student.astype(jnp.float32) / temperature, axis=-1), axis=-1)


def koleo(x: jax.Array, eps: float = 1e-8) -> jax.Array:
    """DINOv2's KoLeo loss of (B, D) vectors: L2-normalise, find each row's nearest other row by the largest dot
    product, -mean log(||x_i - x_nn(i)|| + eps). PyTorch's pairwise_distance adds 1e-6 to the difference; kept."""
    x = x.astype(jnp.float32)
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    dots = x @ x.T
    dots = jnp.where(jnp.eye(x.shape[0], dtype=bool), -1.0, dots)  # never oneself
    nearest = jnp.argmax(dots, axis=1)
    dist = jnp.linalg.norm(x - x[nearest] + 1e-6, axis=-1)
    return -jnp.mean(jnp.log(dist + eps))


def dino_loss(teacher_probs: jax.Array, student_global: jax.Array, student_local: jax.Array | None,
              temperature: float) -> jax.Array:
    """Per example (B,): DINO's loss over every (teacher crop, other student crop) pair, averaged over the pairs.

    `teacher_probs` (B, G, K) are the targets of the G global crops; `student_global` (B, G, K) and `student_local`
    (B, L, K) the student's logits. Global crop i learns from every other global crop j != i (G(G-1) terms), each
    local crop from every global crop (L*G terms). DINOv2 divides the sum of its terms by their count, its global
    terms counted twice over half of them (loss_scales = 2): the same mean."""
    g = teacher_probs.shape[1]
    ce_global = cross_entropy(teacher_probs[:, :, None], student_global[:, None, :], temperature)  # (B, Gt, Gs)
    total = jnp.sum(ce_global * (1.0 - jnp.eye(g))[None], axis=(1, 2))
    terms = g * (g - 1)
    if student_local is not None and student_local.shape[1]:
        ce_local = cross_entropy(teacher_probs[:, :, None], student_local[:, None, :], temperature)  # (B, G, L)
        total = total + ce_local.sum(axis=(1, 2))
        terms += g * student_local.shape[1]
    return total / terms


def ibot_loss(teacher_probs: jax.Array, student: jax.Array, masks: jax.Array, temperature: float) -> jax.Array:
    """Per image (M,): iBOT's masked-token loss, the cross-entropy averaged over the image's masked patches (0 for an
    image without any). `teacher_probs` and `student` (M, N, K), `masks` (M, N). DINOv2 weights each patch by
    1/#masked of its image and divides the sum by the number of images: the mean of this over the images."""
    m = masks.astype(jnp.float32)
    ce = cross_entropy(teacher_probs, student, temperature)
    return (ce * m).sum(-1) / jnp.maximum(m.sum(-1), 1.0)
