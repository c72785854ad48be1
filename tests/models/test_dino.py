"""DINO / iBOT / DINOv2 pieces against NumPy transcriptions of the reference (facebookresearch/dinov2 loss/*.py,
data/collate.py, train/ssl_meta_arch.py), written here from their published formulas: Sinkhorn-Knopp, centring and
its EMA, the teacher's EMA, the DINO / iBOT / KoLeo losses, iBOT's mask ratios, and multi-crop shapes and
determinism (a row's crops depend on its global index only, so not on how the batch is split over processes)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.data.multicrop import CropSpec, ibot_masks, multi_crop
from vit_jax.errors import ConfigError
from vit_jax.models.config import vit_config
from vit_jax.models.dino_losses import centered_softmax, cross_entropy, dino_loss, ibot_loss, koleo, sinkhorn_knopp
from vit_jax.train.objectives.dino import Dino, DinoConfig, cosine_momentum, teacher_temperature

RNG = np.random.default_rng(0)


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def np_softmax(x):
    return np.exp(np_log_softmax(x))


def np_sinkhorn(teacher_output, temp, iterations=3):
    """dinov2 DINOLoss.sinkhorn_knopp_teacher on one process, in its (K, B) layout."""
    q = np.exp(teacher_output / temp).T
    k, b = q.shape
    q = q / q.sum()
    for _ in range(iterations):
        q = q / q.sum(axis=1, keepdims=True) / k
        q = q / q.sum(axis=0, keepdims=True) / b
    return (q * b).T


def test_sinkhorn_knopp_matches_the_reference_and_balances_prototypes():
    t = RNG.uniform(-1, 1, size=(12, 7))  # cosine logits, as the head gives them
    got = np.asarray(sinkhorn_knopp(jnp.asarray(t, jnp.float32), 0.04, 3))
    want = np_sinkhorn(t, 0.04, 3)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-7)
    np.testing.assert_allclose(got.sum(1), 1.0, rtol=1e-5)  # each sample's target is a distribution
    # iBOT: only the masked patches take part; the others get no target.
    w = np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0], np.float32)
    got = np.asarray(sinkhorn_knopp(jnp.asarray(t, jnp.float32), 0.07, 3, jnp.asarray(w)))
    np.testing.assert_allclose(got[w == 1], np_sinkhorn(t[w == 1], 0.07, 3), rtol=2e-4, atol=1e-7)
    assert not got[w == 0].any()


def test_centering_and_its_ema_match_the_reference():
    t, center = RNG.normal(size=(6, 5)), RNG.normal(size=5)
    np.testing.assert_allclose(np.asarray(centered_softmax(jnp.asarray(t), jnp.asarray(center), 0.04)),
                               np_softmax((t - center) / 0.04), rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def tiny():
    cfg = vit_config(None, width=16, depth=1, mlp_dim=32, num_heads=2, patch_size=8, image_size=16, num_classes=0,
                     pool="token")
    d = DinoConfig(head_hidden=16, head_bottleneck=8, prototypes=10, local_crops=1, local_crop_size=8,
                   momentum_start=0.9)
    objective = Dino(cfg, d)
    objective.total_steps = 10
    return objective


def test_the_teacher_and_centres_follow_their_exact_ema(tiny):
    d = tiny.d
    params = jax.tree.map(lambda s: jnp.asarray(RNG.normal(size=s.shape), s.dtype), tiny.model.shapes)
    extra = tiny.init_extra(jax.random.key(0), params)
    jax.tree.map(np.testing.assert_array_equal, extra["teacher"], params)  # the student's copy at step 0
    new_params = jax.tree.map(lambda p: p + 1.0, params)
    aux = {"center": jnp.arange(10.0), "patch_center": -jnp.arange(10.0)}
    step = 4  # after the 4th applied step: momentum of step index 3 of 10
    out = jax.jit(tiny.update_extra)(extra, new_params, jnp.asarray(step), aux)
    m = 1.0 - (1.0 - 0.9) * (np.cos(np.pi * 3 / 10) + 1) / 2
    jax.tree.map(lambda t, p, n: np.testing.assert_allclose(n, m * np.asarray(t) + (1 - m) * np.asarray(p), rtol=1e-6,
                                                            atol=1e-6), extra["teacher"], new_params, out["teacher"])
    np.testing.assert_allclose(out["center"], 0.1 * np.arange(10.0), rtol=1e-6)  # 0.9 * 0 + 0.1 * batch mean
    np.testing.assert_allclose(out["patch_center"], -0.1 * np.arange(10.0), rtol=1e-6)
    assert int(out["step"]) == 4
    assert float(cosine_momentum(jnp.asarray(10), 10, 0.992, 1.0)) == 1.0
    assert float(cosine_momentum(jnp.asarray(0), 10, 0.992, 1.0)) == pytest.approx(0.992)
    assert float(teacher_temperature(jnp.asarray(0), 10, d)) == pytest.approx(0.04)
    assert float(teacher_temperature(jnp.asarray(3), 10, d)) == pytest.approx(0.07)


def test_dino_ibot_and_koleo_losses_match_the_reference():
    b, g, l, k, n = 3, 2, 4, 6, 5
    tp = np_softmax(RNG.normal(size=(b, g, k)))
    sg, sl = RNG.normal(size=(b, g, k)), RNG.normal(size=(b, l, k))
    # ssl_meta_arch: global terms pair crop A with B (x loss_scales 2 over a 2B-row mean), local crops every global
    # target; the sum divided by n_global_terms + n_local_terms.
    lsm = lambda s: np_log_softmax(s / 0.1)  # noqa: E731
    glob = sum(-(tp[:, j] * lsm(sg[:, i])).sum(-1).mean() for i in range(g) for j in range(g) if i != j)
    loc = sum(-(tp[:, j] * lsm(sl[:, i])).sum(-1).mean() for i in range(l) for j in range(g))
    want = (glob + loc) / (g * (g - 1) + g * l)
    got = dino_loss(jnp.asarray(tp), jnp.asarray(sg), jnp.asarray(sl), 0.1)
    assert float(got.mean()) == pytest.approx(want, rel=1e-5)
    # iBOTPatchLoss.forward_masked: per masked patch CE, weight 1/#masked of its image, summed / number of images.
    tpp, sp = np_softmax(RNG.normal(size=(4, n, k))), RNG.normal(size=(4, n, k))
    masks = np.array([[1, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 0], [0, 0, 0, 0, 1]], bool)
    ce = -(tpp * lsm(sp)).sum(-1)
    weight = 1.0 / np.maximum(masks.sum(-1, keepdims=True), 1)
    want = (ce * weight)[masks].sum() / masks.shape[0]
    got = ibot_loss(jnp.asarray(tpp), jnp.asarray(sp), jnp.asarray(masks), 0.1)
    assert float(got.mean()) == pytest.approx(want, rel=1e-5)
    # KoLeoLoss: normalise, nearest other row by dot product, -mean log(pairwise_distance + 1e-8).
    x = RNG.normal(size=(7, 4))
    xn = x / np.linalg.norm(x, axis=-1, keepdims=True)
    dots = xn @ xn.T
    np.fill_diagonal(dots, -1)
    nn = dots.argmax(1)
    want = -np.log(np.linalg.norm(xn - xn[nn] + 1e-6, axis=-1) + 1e-8).mean()
    assert float(koleo(jnp.asarray(x))) == pytest.approx(want, rel=1e-5)
    assert float(cross_entropy(jnp.asarray(tp[0]), jnp.asarray(sg[0]), 0.1)[0]) == pytest.approx(
        -(tp[0, 0] * lsm(sg[0, 0])).sum(), rel=1e-5)


def test_ibot_masks_mask_half_the_crops_at_stratified_ratios():
    n_img, grid = 16, (14, 14)
    masks = np.asarray(jax.jit(lambda k: ibot_masks(k, n_img, grid, 0.5, (0.1, 0.5)))(jax.random.key(3)))
    counts = masks.sum(1)
    ratios = np.sort(counts[counts > 0]) / 196
    assert (counts > 0).sum() == 8  # int(16 * 0.5) images masked, the others not at all
    strata = np.linspace(0.1, 0.5, 9)
    # Sorted, the masked images' ratios sit at or below their strata's upper ends; block masking may stop short of
    # a target by less than a block, never above it.
    assert np.all(ratios <= strata[1:] + 1e-9) and ratios.max() <= 0.5 and ratios.min() > 0
    assert ratios[-1] > 0.3  # the top stratum is reached: ratios spread over the range, not all small
    # Blocks, not scattered patches: most masked patches have a masked neighbour.
    m = masks.reshape(n_img, *grid)
    neighbour = np.zeros_like(m)
    neighbour[:, 1:] |= m[:, :-1]
    neighbour[:, :-1] |= m[:, 1:]
    neighbour[:, :, 1:] |= m[:, :, :-1]
    neighbour[:, :, :-1] |= m[:, :, 1:]
    assert (m & neighbour).sum() >= 0.9 * m.sum()


def test_multi_crop_shapes_and_determinism_whatever_the_split():
    images = jax.random.uniform(jax.random.key(0), (4, 24, 24, 3), minval=-1, maxval=1)
    specs = (CropSpec(16, (0.32, 1.0), 1.0, 0.0), CropSpec(16, (0.32, 1.0), 0.1, 0.2),
             CropSpec(8, (0.05, 0.32), 0.5, 0.0))
    crop = jax.jit(lambda x, k, r: multi_crop(x, k, specs, r))
    key = jax.random.key(7)
    full = crop(images, key, jnp.arange(4))
    assert [c.shape for c in full] == [(4, 16, 16, 3), (4, 16, 16, 3), (4, 8, 8, 3)]
    assert all(float(jnp.abs(c).max()) <= 1.0 + 1e-6 for c in full)
    again = crop(images, key, jnp.arange(4))
    jax.tree.map(np.testing.assert_array_equal, full, again)  # the same key: the same crops
    # A row's crops depend on its image and its global index only, not on what else its process holds: the rows in
    # another order (as another split would place them; same shapes, so one compiled program) give the same crops.
    order = jnp.asarray([2, 3, 0, 1])
    part = crop(images[order], key, order)
    for a, b in zip(full, part):
        np.testing.assert_allclose(a[order], b, atol=1e-6)
    other = crop(images, jax.random.key(8), jnp.arange(4))
    assert not np.allclose(full[0], other[0])  # another step's key: other crops
    assert not np.allclose(full[0][0], full[1][0])  # the two global crops of an image differ


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_head_flops_per_token_match_xla_cost_analysis(layers):
    from flax import nnx

    from vit_jax.models.dino import DINOHead

    d = DinoConfig(head_hidden=48, head_bottleneck=32, prototypes=256, head_layers=layers)
    head = DINOHead(64, d.head(), param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    graph, state = nnx.split(head)

    def per_token(fn, width, *args):  # the difference of two batch sizes (the prototypes' normalisation is per call)
        def flops(rows):
            lowered = jax.jit(fn).lower(*args, jax.ShapeDtypeStruct((rows, width), jnp.float32))
            cost = lowered.compile().cost_analysis()
            return (cost[0] if isinstance(cost, list) else cost)["flops"]
        return flops(2) - flops(1)

    analytic = Dino(vit_config("ViT-S/16", width=64, depth=1, mlp_dim=128, num_heads=2, num_classes=0,
                               image_size=(32, 32)), d).flops.breakdown["head_per_token"]
    # The count is the matrix products'; XLA also counts the exact GELUs between the layers (and the L2 norm).
    gelus = (layers - 1) * per_token(lambda x: jax.nn.gelu(x, approximate=False), 48)
    xla = per_token(lambda st, x: nnx.merge(graph, st)(x), 64, state)
    assert xla - gelus == pytest.approx(analytic, rel=0.01)


def test_dino_settings_mistakes_are_one_line_errors():
    with pytest.raises(ConfigError, match="dino.centering='sk'"):
        DinoConfig(centering="sk")
    with pytest.raises(ConfigError, match="momentum_start"):
        DinoConfig(momentum_start=1.1)
    with pytest.raises(ConfigError, match="local range"):
        DinoConfig(local_scale_min=0.5, local_scale_max=0.1)
    cfg = vit_config(None, width=16, depth=1, mlp_dim=32, num_heads=2, patch_size=8, image_size=16, num_classes=0)
    with pytest.raises(ConfigError, match="not a multiple of the patch size"):
        Dino(cfg.replace(pool="token"), DinoConfig(local_crop_size=12))


def test_micro_batches_pass_the_centres_their_averaged_batch_means(tiny):
    """The seam's loss aux under micro-batching (train/step.py): the centre moves by the mean teacher logits of the
    whole batch, however many micro-batches compute it (equal-sized ones: the mean of their means)."""
    import optax

    from vit_jax.train.step import init_state, make_train_step

    # Crops and flips only, no local crops or iBOT: the smallest step to compile (the rest is tested above).
    tiny = Dino(tiny.model.cfg, DinoConfig(head_hidden=16, head_bottleneck=8, prototypes=10, local_crops=0,
                                           augment=False, ibot_weight=0.0))
    tiny.total_steps = 10
    params = jax.jit(tiny.model.init)(jax.random.key(0))
    tx = optax.sgd(0.0)  # the student stays put: the teacher and the centre's batch are the initial model's
    state = init_state(params, tx, jax.random.key_data(jax.random.key(1)))
    state["extra"] = tiny.init_extra(jax.random.key(2), params)
    batch = {"image": jax.random.uniform(jax.random.key(3), (8, 16, 16, 3), minval=-1, maxval=1)}
    step = jax.jit(make_train_step(tiny, tx, lambda s: 0.0, micro_batches=2))
    new_state, metrics = step(state, batch)

    @jax.jit
    def batch_mean(state, batch):  # the teacher's (= the initial student's) mean logits over the step's crops
        key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), 0)
        teacher = tiny.model.bind(state["params"])
        cls, _ = teacher.encode(tiny.inputs(batch, key)["global"].reshape(16, 16, 16, 3))
        return teacher.heads(cls)[0].mean(0)

    want = 0.1 * np.asarray(batch_mean(state, batch))  # 0.9 * centre 0 + 0.1 * the batch mean
    np.testing.assert_allclose(new_state["extra"]["center"], want, rtol=1e-4, atol=1e-6)
    assert bool(metrics["finite"]) and int(new_state["extra"]["step"]) == 1
