"""CutMix (data/mixup.py) box statistics against an independent numpy transcription of the paper's box rule, the
mixup/CutMix switch rate, and LAMB (optimizer.name='lamb') against optax.lamb."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vit_jax.data.mixup import cutmix_box, mix
from vit_jax.train.optimizer import make_optimizer

H, W, DRAWS = 12, 20, 4000


def numpy_box_areas(lams: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The box rule of Yun et al.'s code: sides floor(H sqrt(1-lam)), centre uniform, clipped; area fraction."""
    cut = np.sqrt(1.0 - lams)
    ch, cw = np.floor(H * cut).astype(int), np.floor(W * cut).astype(int)
    cy, cx = rng.integers(0, H, lams.shape), rng.integers(0, W, lams.shape)
    h = np.clip(cy + ch // 2, 0, H) - np.clip(cy - ch // 2, 0, H)
    w = np.clip(cx + cw // 2, 0, W) - np.clip(cx - cw // 2, 0, W)
    return h * w / (H * W)


def test_cutmix_boxes_have_the_papers_statistics_and_lambda_is_the_kept_area():
    keys = jax.random.split(jax.random.key(0), DRAWS)
    lams = jax.random.beta(jax.random.key(1), 1.0, 1.0, (DRAWS,))
    boxes, corrected = jax.jit(jax.vmap(lambda k, lam: cutmix_box(k, lam, H, W)))(keys, lams)
    boxes, corrected = np.asarray(boxes), np.asarray(corrected)
    np.testing.assert_allclose(1.0 - boxes.mean(axis=(1, 2)), corrected, atol=1e-6)  # lambda = the kept area
    assert (corrected >= np.asarray(lams) - 1e-6).all()  # clipping only shrinks the box
    ours = 1.0 - corrected
    reference = numpy_box_areas(np.random.default_rng(2).beta(1.0, 1.0, DRAWS * 5), np.random.default_rng(3))
    assert abs(ours.mean() - reference.mean()) < 0.02, (ours.mean(), reference.mean())
    assert abs(np.median(ours) - np.median(reference)) < 0.03
    coverage = boxes.mean(axis=0)  # a centre uniform over the image covers its middle more than its corners
    assert coverage[H // 2, W // 2] > 2 * coverage[0, 0]


def test_mix_switches_between_mixup_and_cutmix_and_mixes_labels_by_the_kept_area():
    images = jnp.arange(4 * H * W * 3, dtype=jnp.float32).reshape(4, H, W, 3)
    batch = {"image": images, "labels": jax.nn.one_hot(jnp.arange(4), 4)}
    draws = jax.jit(jax.vmap(lambda k: mix(batch, k, 0.8, 1.0, 0.3)))(jax.random.split(jax.random.key(0), 1000))
    assert abs(float(draws["cutmix"].mean()) - 0.3) < 0.05
    cut = np.asarray(draws["cutmix"])
    lam = np.asarray(draws["mixup_lambda"])
    mixed_images, labels = np.asarray(draws["image"]), np.asarray(draws["labels"])
    np.testing.assert_allclose(labels[:, 0, 0], lam, atol=1e-6)
    np.testing.assert_allclose(labels[:, 0, 3], 1 - lam, atol=1e-6)  # example 0 mixed with example 3
    kept = (mixed_images[cut][:, 0] == np.asarray(images[0])).all(-1).mean(axis=(1, 2))
    np.testing.assert_allclose(kept, lam[cut], atol=1e-6)  # cut batches: pixels either image's, lambda = kept share


def test_cutmix_on_clips_cuts_the_same_box_in_every_frame():
    clips = jnp.arange(4 * 3 * H * W * 2, dtype=jnp.float32).reshape(4, 3, H, W, 2)  # (B, T, H, W, C)
    batch = {"image": clips, "labels": jax.nn.one_hot(jnp.arange(4), 4)}
    out = jax.jit(lambda k: mix(batch, k, 0.0, 1.0))(jax.random.key(3))
    taken = np.asarray((out["image"] == clips[::-1]).all(-1) & (out["image"] != clips).all(-1))  # (B, T, H, W)
    box = taken[0, 0]
    assert 0 < box.sum() < H * W, "a box strictly inside the frame for this key"
    assert (taken == box).all(), "every clip and every frame cut at the same place"
    np.testing.assert_allclose(float(out["mixup_lambda"]), 1.0 - box.mean(), atol=1e-6)


def test_lamb_is_optax_lamb():
    o = ml_collections.ConfigDict(dict(name="lamb", b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.05,
                                       decay_mask="all", grad_clip_norm=0.0, mu_dtype="float32", layer_decay=0.0,
                                       momentum=0.0, nesterov=False))
    params = {"a": jnp.ones((3, 4)), "b": jnp.arange(5.0)}
    ours, ref = make_optimizer(o, optax.constant_schedule(1e-2), params), optax.lamb(1e-2, eps=1e-6,
                                                                                     weight_decay=0.05)
    p1, p2, s1, s2 = params, params, ours.init(params), ref.init(params)
    for i in range(3):
        grads = jax.tree.map(lambda x: jnp.sin(x + i), p1)
        u1, s1 = ours.update(grads, s1, p1)
        u2, s2 = ref.update(grads, s2, p2)
        p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), p1, p2)
    assert not np.allclose(p1["a"], params["a"])
