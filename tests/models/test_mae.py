"""MAE (models/mae.py, train/objectives.py): masking statistics and determinism, what the encoder sees, output
shapes, the loss on a hand-computed case, the parameter tree a fine-tune loads, and FLOPs against XLA's count."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.models.xla_cost import xla_flops_per_image
from vit_jax.models.config import ModelConfigError, vit_config
from vit_jax.models.flops import mae_flops, vit_flops
from vit_jax.models.mae import MASK_STREAM, MAEConfig, MAEViT, masked, patch_orders, reconstruction_loss
from vit_jax.models.vit import FunctionalViT
from vit_jax.train.objectives import MAE

TINY = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8, image_size=32, num_classes=0)
TINY_MAE = MAEConfig(decoder_width=32, decoder_depth=1, decoder_heads=2, decoder_mlp_dim=64)


@pytest.fixture(scope="module")
def objective():
    return MAE(vit_config(**TINY), TINY_MAE)


def test_every_example_masks_exactly_75_percent_of_its_patches(objective):
    orders = np.asarray(jax.jit(objective.orders, static_argnums=1)(jax.random.key(3), 512))
    n = objective.num_patches
    assert n == 16 and objective.num_visible == 4
    assert (np.sort(orders, axis=1) == np.arange(n)).all()  # every row is a permutation of the patches
    mask = np.asarray(masked(jnp.asarray(orders), objective.num_visible))
    assert (mask.sum(1) == 12).all()  # exactly 75% masked, in every example
    assert (mask[np.arange(512)[:, None], orders[:, 4:]] == 1).all() and (mask[np.arange(512)[:, None],
                                                                             orders[:, :4]] == 0).all()
    # Per example and uniform: each patch is masked in ~75% of the examples (binomial sd 1.9%), and the examples'
    # masks are not copies of each other (1820 possible visible sets for 4 of 16).
    assert np.abs(mask.mean(0) - 0.75).max() < 0.1
    assert len({tuple(sorted(r[:4])) for r in orders}) > 400


def test_masks_are_a_function_of_seed_step_and_example_index_only(objective):
    key = jax.random.key(0)
    step_key = jax.random.fold_in(key, 7)
    orders = jax.jit(objective.orders, static_argnums=1)
    full = np.asarray(orders(step_key, 16))
    assert (full == np.asarray(objective.orders(step_key, 16))).all()  # deterministic (and jit or not)
    assert not (full == np.asarray(orders(jax.random.fold_in(key, 8), 16))).all()  # another step
    # A batch split over processes (each process's rows) or micro-batches sees the same mask for an example:
    # patch_orders of rows 8..15 alone equals those rows of the whole batch.
    part = patch_orders(jax.random.fold_in(step_key, MASK_STREAM), jnp.arange(8, 16), objective.num_patches)
    np.testing.assert_array_equal(np.asarray(part), full[8:])
    # ... and sharding the batch over 8 devices does not change the draws.
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    sharded = jax.jit(lambda k: objective.orders(k, 16), out_shardings=NamedSharding(mesh, P("data")))(step_key)
    assert len(sharded.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(sharded), full)


def test_the_encoder_sees_only_the_visible_patches(objective):
    model = objective.model
    params = jax.jit(model.init)(jax.random.key(0))  # jitted: one compile, not one per op
    images = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), minval=-1, maxval=1)
    orders = objective.orders(jax.random.key(2), 2)
    reconstruct = jax.jit(lambda p, x, o: model.bind(p).reconstruct(x, o))
    pred = reconstruct(params, images, orders)
    assert pred.shape == (2, 16, 8 * 8 * 3)  # every patch's pixels
    # Rewriting the pixels of every masked patch changes nothing: they never reach the encoder.
    mask = np.asarray(masked(orders, objective.num_visible)).reshape(2, 4, 1, 4, 1, 1)
    noise = jax.random.normal(jax.random.key(4), (2, 4, 8, 4, 8, 3))
    changed = images + jnp.asarray(mask * noise).reshape(2, 32, 32, 3)
    np.testing.assert_array_equal(np.asarray(reconstruct(params, changed, orders)), np.asarray(pred))
    # ... while a visible patch's pixels do matter.
    visible = 1 - mask
    touched = images + jnp.asarray(visible * noise).reshape(2, 32, 32, 3)
    assert not np.array_equal(np.asarray(reconstruct(params, touched, orders)), np.asarray(pred))


def test_encoder_parameters_are_a_classification_vits_and_features_are_its_forward_pass(objective):
    params = jax.jit(objective.model.init)(jax.random.key(0))
    encoder = {k: v for k, v in params.items() if k != "decoder"}
    vit = FunctionalViT(vit_config(**TINY))
    assert jax.tree.map(lambda x: x.shape, encoder) == jax.tree.map(lambda x: x.shape, vit.shapes)
    assert set(params["decoder"]) == {"embed", "mask_token", "transformer", "pred"}
    images = jnp.zeros((2, 32, 32, 3))
    _, out = jax.jit(objective.model.apply)(params, images)  # the few-shot probe's features: the ViT on the image
    expected = jax.jit(vit.apply)(encoder, images)[1]["pre_logits"]
    np.testing.assert_array_equal(np.asarray(out["pre_logits"]), np.asarray(expected))


def test_reconstruction_loss_on_a_hand_computed_case():
    # One 2x1 image of 1x1 patches: patch 0 = (1, 2, 3) (masked), patch 1 = (0, 0, 6) (visible), prediction 0.
    images = jnp.asarray([[[[1.0, 2.0, 3.0]], [[0.0, 0.0, 6.0]]]])  # (1, 2, 1, 3)
    pred = jnp.zeros((1, 2, 3))
    mask = jnp.asarray([[1.0, 0.0]])
    # Raw pixels: (1 + 4 + 9) / 3 over the one masked patch.
    assert float(reconstruction_loss(pred, images, mask, (1, 1), norm_pix=False)[0]) == pytest.approx(14 / 3)
    # Normalised: mean 2, unbiased variance 1 -> target (-1, 0, 1) / sqrt(1 + 1e-6) -> (1 + 0 + 1) / 3 / (1 + 1e-6).
    assert float(reconstruction_loss(pred, images, mask, (1, 1))[0]) == pytest.approx(2 / 3 / (1 + 1e-6), rel=1e-6)
    # Both masked: the mean over the two; patch 1: mean 2, variance 12 -> (-2, -2, 4) / sqrt(12) -> 24 / 12 / 3.
    both = reconstruction_loss(pred, images, jnp.ones((1, 2)), (1, 1))[0]
    assert float(both) == pytest.approx((2 / 3 / (1 + 1e-6) + 2 / 3 / (1 + 1e-6 / 12)) / 2, rel=1e-6)
    # Raw, both masked: (14 / 3 + 36 / 3) / 2.
    assert float(reconstruction_loss(pred, images, jnp.ones((1, 2)), (1, 1), norm_pix=False)[0]) == pytest.approx(
        (14 / 3 + 12) / 2)


def test_unsupported_encoders_and_ratios_are_one_line_errors():
    with pytest.raises(ModelConfigError, match="pool='map'"):
        FunctionalViT(vit_config(**{**TINY, "pool": "map"}), functools.partial(MAEViT, mae=TINY_MAE))
    with pytest.raises(ModelConfigError, match="mask_ratio"):
        MAEConfig(mask_ratio=1.0)


def test_mae_flops_match_xla_within_2_percent():
    # Large enough that matrix products dominate as in real models (elementwise work is not counted).
    cfg = vit_config(width=384, depth=2, mlp_dim=1536, num_heads=6, patch_size=16, image_size=224, num_classes=0)
    mae = MAEConfig(decoder_width=256, decoder_depth=2, decoder_heads=8, decoder_mlp_dim=1024)
    model = MAE(cfg, mae).model

    class Reconstruct:  # the pretraining forward pass, in the (params, images) form xla_flops_per_image compiles
        shapes = model.shapes

        @staticmethod
        def apply(params, images):
            orders = jnp.broadcast_to(jnp.arange(cfg.num_patches), (images.shape[0], cfg.num_patches))
            return model.bind(params).reconstruct(images, orders), None

    analytic = mae_flops(cfg, mae)
    assert xla_flops_per_image(Reconstruct, cfg.image_size) == pytest.approx(analytic.forward, rel=0.02)
    # The encoder runs on 49 + 1 of the 197 tokens: a bit under 50/197 of its cost on the whole image.
    assert 0.2 < analytic.breakdown["encoder"] / vit_flops(cfg).breakdown["encoder"] < 50 / 197
