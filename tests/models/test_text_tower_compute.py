"""The text tower follows the image tower's compute dtype and rematerialisation (model.dtype / model.remat, set on
TextConfig by the image-text objectives): remat changes no value or gradient, bfloat16 computes in bfloat16."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vit_jax.models.config import ModelConfigError
from vit_jax.models.text import TextConfig, TextTransformer

BASE = TextConfig(vocab_size=50, max_len=8, width=32, depth=2, num_heads=4, mlp_dim=64)


def test_remat_keeps_values_and_gradients_and_bfloat16_computes_in_bfloat16():
    with nnx.use_eager_sharding(False):
        model = TextTransformer(BASE, 16, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 50, (3, 8)))

    def forward(p, cfg):
        m = nnx.merge(graphdef, p)
        m.cfg = cfg
        return m(ids)[0]

    def loss(p, cfg):
        return forward(p, cfg).sum()

    remat = dataclasses.replace(BASE, remat="full")
    plain_grad, remat_grad = jax.jit(lambda p: (jax.grad(loss)(p, BASE), jax.grad(loss)(p, remat)))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), remat_grad, plain_grad)
    y, y16 = jax.jit(lambda p: (forward(p, BASE), forward(p, dataclasses.replace(BASE, dtype="bfloat16"))))(params)
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float32), y, atol=0.1)
    with pytest.raises(ModelConfigError, match="text dtype 'int8'"):
        TextConfig(dtype="int8")
