"""Mixup: on-device batch mixing with the reversed batch."""

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.data.mixup import mixup


def test_mixup_mixes_images_and_labels_with_the_reversed_batch():
    rng = np.random.default_rng(0)
    batch = {"image": jnp.asarray(rng.normal(size=(4, 2, 2, 3)), jnp.float32),
             "labels": jax.nn.one_hot(jnp.array([0, 1, 2, 3]), 5), "label": jnp.arange(4)}
    out = jax.jit(mixup, static_argnames="alpha")(batch, jax.random.key(1), alpha=0.4)
    lam = float(out["mixup_lambda"])
    assert 0.0 <= lam <= 1.0
    np.testing.assert_allclose(out["image"], lam * batch["image"] + (1 - lam) * batch["image"][::-1], rtol=1e-5)
    np.testing.assert_allclose(out["labels"].sum(1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(out["labels"][0], [lam, 0, 0, 1 - lam, 0], rtol=1e-5)
    np.testing.assert_array_equal(out["label"], batch["label"])


def test_mixup_lambda_follows_beta_and_alpha_zero_is_identity():
    batch = {"image": jnp.ones((2, 1, 1, 3)), "labels": jnp.eye(2)}
    lams = np.array([float(mixup(batch, jax.random.key(i), alpha=0.2)["mixup_lambda"]) for i in range(200)])
    # Beta(0.2, 0.2) is U-shaped: most draws are near 0 or 1, and the mean is 1/2.
    assert abs(lams.mean() - 0.5) < 0.1 and np.mean((lams < 0.1) | (lams > 0.9)) > 0.5
    out = mixup(batch, jax.random.key(0), alpha=0.0)
    np.testing.assert_array_equal(out["labels"], batch["labels"])
