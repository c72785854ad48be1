"""Masked patch prediction (models/mpp.py, train/objectives.py): corruption statistics and determinism, what the
encoder is given, each target's shape and a hand-computed value, the loss on a toy case, the parameter tree a
fine-tune loads, and FLOPs against XLA's count."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax.models.config import ModelConfigError, vit_config
from vit_jax.models.flops import mpp_flops, vit_flops
from vit_jax.models.mpp import (CORRUPTION_STREAM, KEEP, MASK, RANDOM, MPPConfig, MPPViT, color_classes,
                                corrupt_patches, prediction_loss, targets)
from vit_jax.models.vit import FunctionalViT
from vit_jax.train.objectives import MaskedPatchPrediction

TINY = dict(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8, image_size=32, num_classes=0)


@pytest.fixture(scope="module")
def objective():
    return MaskedPatchPrediction(vit_config(**TINY), MPPConfig())


# Every draw below through one jitted function (eager, the vmapped draws dispatch op by op: seconds each).
draw = jax.jit(corrupt_patches, static_argnums=(2, 3))


def test_every_example_corrupts_exactly_half_its_patches_80_10_10(objective):
    b, n, k = 512, 16, 8
    c = jax.device_get(draw(jax.random.key(3), jnp.arange(b), n, MPPConfig()))
    order, kind, source = c["order"], c["kind"], c["source"]
    assert order.shape == (b, n) and kind.shape == source.shape == (b, k)
    assert (np.sort(order, axis=1) == np.arange(n)).all()  # a permutation: exactly K distinct patches corrupted
    # 80/10/10 over 4096 corrupted patches, within 4 binomial standard deviations (mask: 2.5%, the others: 1.9%).
    frac = np.bincount(kind.ravel(), minlength=3) / kind.size
    assert abs(frac[MASK] - 0.8) < 0.025 and abs(frac[RANDOM] - 0.1) < 0.019 and abs(frac[KEEP] - 0.1) < 0.019
    assert (source != order[:, :k]).all() and source.min() >= 0 and source.max() < n  # another patch of the image
    # Per example and uniform: every patch is corrupted in ~half of the examples (binomial sd 2.2%), and the
    # examples' corrupted sets are not copies of each other (12870 possible sets of 8 of 16: ~10 repeats by chance).
    corrupted = np.zeros((b, n))
    corrupted[np.arange(b)[:, None], order[:, :k]] = 1
    assert np.abs(corrupted.mean(0) - 0.5).max() < 0.1
    assert len({tuple(sorted(r[:k])) for r in order}) > 480
    # Another ratio and split: exact counts follow.
    other = draw(jax.random.key(0), jnp.arange(4), n, MPPConfig(corrupt_ratio=0.25, mask_prob=1.0, random_prob=0.0))
    assert other["kind"].shape == (4, 4) and (np.asarray(other["kind"]) == MASK).all()


def test_corruptions_are_a_function_of_seed_step_and_example_index_only(objective):
    step_key = jax.random.fold_in(jax.random.key(0), 7)
    key = jax.random.fold_in(step_key, CORRUPTION_STREAM)  # the objective's stream of the step's key
    full = jax.device_get(draw(key, jnp.arange(16), 16, MPPConfig()))
    jax.tree.map(np.testing.assert_array_equal, full, jax.device_get(draw(key, jnp.arange(16), 16, MPPConfig())))
    other_step = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), 8), CORRUPTION_STREAM)
    assert not (full["order"] == np.asarray(draw(other_step, jnp.arange(16), 16, MPPConfig())["order"])).all()
    # The rows 8..15 of a batch split over processes or micro-batches draw what they draw in the whole batch ...
    part = draw(key, jnp.arange(8, 16), 16, MPPConfig())
    jax.tree.map(lambda a, f: np.testing.assert_array_equal(np.asarray(a), f[8:]), part, full)
    # ... and the objective's draw of the global batch, sharded over 8 devices, is the same.
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    sharded = jax.jit(lambda k: objective.corruption(k, 16), out_shardings=NamedSharding(mesh, P("data")))(step_key)
    assert len(sharded["order"].sharding.device_set) == 8
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(sharded), full)


def test_the_encoder_gets_mask_random_and_kept_embeddings_where_drawn(objective):
    model = objective.model

    @jax.jit
    def run(key):
        k_params, k_images, k_draw = jax.random.split(key, 3)
        params = model.init(k_params)
        images = jax.random.uniform(k_images, (4, 32, 32, 3), minval=-1, maxval=1)
        c = objective.corruption(k_draw, 4)
        bound = model.bind(params)
        return bound.corrupted_embeddings(images, **c), bound.embed(images), params["mpp"]["mask_embedding"], c

    got, clean, mask_embedding, c = jax.device_get(run(jax.random.key(0)))
    mask_embedding = mask_embedding[0, 0]
    order, kind, source = (c[k] for k in ("order", "kind", "source"))
    for i in range(4):
        for j in range(16):
            r = list(order[i]).index(j)
            if r >= 8 or kind[i, r] == KEEP:  # uncorrupted, or corrupted but kept as it is
                np.testing.assert_array_equal(got[i, j], clean[i, j])
            elif kind[i, r] == MASK:
                np.testing.assert_array_equal(got[i, j], mask_embedding)
            else:
                np.testing.assert_array_equal(got[i, j], clean[i, source[i, r]])
    assert set(kind.ravel()) >= {MASK}


def test_colour_targets_of_known_images():
    # A constant colour (-1, 0, 0.99) in [-1, 1]: levels floor((x + 1) * 4) = (0, 4, 7) -> 0 * 64 + 4 * 8 + 7 = 39.
    image = jnp.broadcast_to(jnp.asarray([-1.0, 0.0, 0.99]), (1, 16, 16, 3))
    np.testing.assert_array_equal(np.asarray(color_classes(image, (8, 8), 1)), np.full((1, 4, 1), 39))
    assert int(color_classes(jnp.ones((1, 8, 8, 3)), (8, 8), 1)[0, 0, 0]) == 511  # white: the top level of each
    # 4x4 cells of 2x2 px: the cell at row 1, column 2 of the first patch is red, everything else black.
    image = jnp.full((1, 16, 16, 3), -1.0).at[0, 2:4, 4:6, 0].set(1.0)
    cells = np.asarray(color_classes(image, (8, 8), 4))
    assert cells.shape == (1, 4, 16)
    expected = np.zeros((1, 4, 16), int)
    expected[0, 0, 1 * 4 + 2] = 7 * 64
    np.testing.assert_array_equal(cells, expected)
    # ... and the mean colour of that patch: red at 1/16 of its pixels, mean -1 + 2/16 -> level floor(0.5) = 0.
    assert int(color_classes(image, (8, 8), 1)[0, 0, 0]) == 0
    pixels = targets(image, (8, 8), MPPConfig(target="pixels_l2"))
    assert pixels.shape == (1, 4, 192)


def test_each_target_predicts_its_shape_for_the_corrupted_patches():
    for target, outputs in (("mean_color_3bit", 512), ("color_4x4_3bit", 16 * 512), ("pixels_l2", 8 * 8 * 3)):
        objective = MaskedPatchPrediction(vit_config(**TINY), MPPConfig(target=target))
        inputs = {"image": jnp.zeros((2, 32, 32, 3)),
                  **jax.eval_shape(lambda: objective.corruption(jax.random.key(1), 2))}
        params = objective.model.shapes  # shapes only (jax.eval_shape): nothing to compile
        pred = jax.eval_shape(lambda p, i: objective.model.bind(p).predict(
            i["image"], i["order"], i["kind"], i["source"]), params, inputs)
        assert pred.shape == (2, 8, outputs) and params["mpp"]["pred"]["kernel"].shape == (32, outputs)
        loss, accuracy = jax.eval_shape(objective.per_example, params, inputs)
        assert loss.shape == (2,) and (accuracy is None) == (target == "pixels_l2")


def test_prediction_loss_on_a_toy_case():
    cfg = MPPConfig()
    target = jnp.asarray([[[39], [511]]])  # one example, two corrupted patches
    uniform = jnp.zeros((1, 2, 512))
    loss, accuracy = prediction_loss(uniform, target, cfg)
    assert float(loss[0]) == pytest.approx(np.log(512), rel=1e-6)
    # Sure of class 39 for both: the first right (loss ~0), the second wrong (loss 100).
    sure = jnp.zeros((1, 2, 512)).at[:, :, 39].set(100.0)
    loss, accuracy = prediction_loss(sure, target, cfg)
    assert float(accuracy[0]) == 0.5 and float(loss[0]) == pytest.approx(50.0, rel=1e-4)
    # The pixel regression: the mean squared error over the pixels, averaged over the patches.
    loss, accuracy = prediction_loss(jnp.zeros((1, 2, 3)), jnp.asarray([[[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]]]),
                                     MPPConfig(target="pixels_l2"))
    assert accuracy is None and float(loss[0]) == pytest.approx((14 / 3 + 3) / 2)


def test_encoder_parameters_are_a_classification_vits(objective):
    shapes = objective.model.shapes
    encoder = {k: v for k, v in shapes.items() if k != "mpp"}
    vit = FunctionalViT(vit_config(**TINY))
    assert jax.tree.map(lambda x: x.shape, encoder) == jax.tree.map(lambda x: x.shape, vit.shapes)
    assert set(shapes["mpp"]) == {"mask_embedding", "pred"}


def test_unsupported_settings_are_one_line_errors():
    with pytest.raises(ModelConfigError, match="pool='map'"):
        FunctionalViT(vit_config(**{**TINY, "pool": "map"}), functools.partial(MPPViT, mpp=MPPConfig()))
    with pytest.raises(ModelConfigError, match="divisible by 4"):
        FunctionalViT(vit_config(**{**TINY, "patch_size": 6, "image_size": 36}),
                      functools.partial(MPPViT, mpp=MPPConfig(target="color_4x4_3bit")))
    with pytest.raises(ModelConfigError, match="sum <= 1"):
        MPPConfig(mask_prob=0.8, random_prob=0.3)
    with pytest.raises(ModelConfigError, match="corrupt_ratio"):
        MPPConfig(corrupt_ratio=0.0)


def test_mpp_flops_are_the_headless_vits_plus_the_head_on_the_corrupted_patches():
    # No XLA count here (compiling a model big enough for matrix products to dominate takes ~10 s): the encoder part
    # is vit_flops, tested against XLA in tests/models/test_flops.py, and the head is one matrix product.
    cfg = vit_config("B/16", num_classes=0)
    for mpp, outputs in ((MPPConfig(), 512), (MPPConfig(target="color_4x4_3bit"), 16 * 512),
                         (MPPConfig(target="pixels_l2", corrupt_ratio=0.15), 16 * 16 * 3)):
        flops = mpp_flops(cfg, mpp)
        k = 98 if mpp.corrupt_ratio == 0.5 else 29  # round(196 * 0.15) = 29
        assert flops.breakdown == {**vit_flops(cfg).breakdown, "mpp_head": 2.0 * k * 768 * outputs}
        assert flops.forward == sum(flops.breakdown.values())
