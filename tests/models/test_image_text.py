"""The two towers (models/text.py) and the contrastive losses (models/contrastive.py): shapes and masks of the text
tower, the losses against their definitions written out in NumPy, and SigLIP's three forms (global, all-gather,
chunked ring of ppermutes) equal in value and gradient on the 8-device CPU mesh."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models.config import ModelConfigError, ViTConfig
from vit_jax.models.contrastive import sigmoid_loss, sigmoid_loss_sharded, softmax_loss
from vit_jax.models.text import ImageText, TextConfig, TextTransformer
from vit_jax.models.vit import FunctionalViT
from vit_jax.parallel.mesh import make_mesh

TEXT = TextConfig(vocab_size=50, max_len=8, width=32, depth=2, num_heads=2, mlp_dim=64, pool="last")
IMAGE = ViTConfig(image_size=(16, 16), patch_size=(8, 8), width=32, depth=1, mlp_dim=64, num_heads=2,
                  num_classes=0, pool="map", posemb="learn")


def text_tower(cfg):
    return FunctionalViT(cfg, lambda c, rngs: TextTransformer(c, 16, rngs=rngs))


def test_two_towers_embed_images_and_texts_on_the_unit_sphere_with_the_papers_t_and_b():
    model = FunctionalViT(IMAGE, functools.partial(ImageText, text=TEXT, embed_dim=16))
    params = model.init(jax.random.key(0))
    assert set(params) == {"img", "img_proj", "txt", "t", "b"}
    np.testing.assert_allclose(np.exp(params["t"]), [10.0], rtol=1e-6)
    np.testing.assert_array_equal(params["b"], [-10.0])
    zi, zt = jax.jit(lambda p, x, ids: (model.bind(p).embed_image(x), model.bind(p).embed_text(ids)))(
        params, jnp.ones((3, 16, 16, 3)), jnp.arange(16).reshape(2, 8) % 50)
    assert zi.shape == (3, 16) and zt.shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(zi, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(zt, axis=1), 1.0, rtol=1e-5)
    locked = FunctionalViT(IMAGE, functools.partial(ImageText, text=TEXT, embed_dim=16, lock_image=True))
    assert "img" not in locked.shapes  # LiT: the image tower is the objective's extra state


def test_causal_eos_pooling_reads_nothing_after_the_eos_token_and_bidirectional_does():
    causal = text_tower(TextConfig(**{**TEXT.__dict__, "causal": True, "pool": "eos", "eos_id": 2}))
    bidir = text_tower(TextConfig(**{**TEXT.__dict__, "causal": False, "pool": "eos", "eos_id": 2}))
    ids = jnp.array([[5, 6, 2, 0, 0, 0, 0, 0]])
    later = ids.at[0, 5].set(9)  # a token after the EOT
    for tower, changes in ((causal, False), (bidir, True)):
        p = tower.init(jax.random.key(1))
        a, b = jax.jit(jax.vmap(lambda x: tower.apply(p, x[None])[0]))(jnp.concatenate([ids, later]))
        assert (not np.allclose(a, b, atol=1e-6)) == changes


def test_bad_text_settings_are_one_line_errors():
    with pytest.raises(ModelConfigError, match="pool 'cls'"):
        TextConfig(pool="cls")
    with pytest.raises(ModelConfigError, match="not a multiple"):
        TextConfig(width=30, num_heads=4)


def reference_losses(zi, zt, t, b):
    logits = t * zi @ zt.T
    n = len(zi)
    log_sm_rows = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    log_sm_cols = logits - np.log(np.exp(logits).sum(0, keepdims=True))
    softmax = -0.5 * (np.trace(log_sm_rows) + np.trace(log_sm_cols)) / n
    z = 2 * np.eye(n) - 1
    sigmoid = np.sum(np.log1p(np.exp(-z * (logits + b)))) / n
    return softmax, sigmoid


def embeddings(n, d=8, seed=0):
    rng = np.random.default_rng(seed)
    zi, zt = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    return (zi / np.linalg.norm(zi, axis=1, keepdims=True)).astype(np.float64), \
        (zt / np.linalg.norm(zt, axis=1, keepdims=True)).astype(np.float64)


def test_the_losses_are_their_definitions():
    zi, zt = embeddings(6)
    want_softmax, want_sigmoid = reference_losses(zi, zt, 10.0, -3.0)
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    np.testing.assert_allclose(softmax_loss(f32(zi), f32(zt), 10.0), want_softmax, rtol=1e-5)
    np.testing.assert_allclose(sigmoid_loss(f32(zi), f32(zt), 10.0, -3.0), want_sigmoid, rtol=1e-5)


def test_sigmoid_all_gather_and_chunked_forms_agree_to_1e6_on_8_devices():
    data, fsdp = 4, 2  # the batch split over two mesh axes: the ring runs over their product
    mesh = make_mesh(data, fsdp, 1)
    zi, zt = (jnp.asarray(a, jnp.float32) for a in embeddings(32, d=16, seed=data))
    t, b = jnp.float32(10.0), jnp.float32(-10.0)
    axes = ("data", "fsdp")
    forms = {"global": jax.jit(sigmoid_loss),
             "gather": jax.jit(functools.partial(sigmoid_loss_sharded, mesh=mesh, batch_axes=axes, chunked=False)),
             "chunked": jax.jit(functools.partial(sigmoid_loss_sharded, mesh=mesh, batch_axes=axes, chunked=True))}
    values = {k: float(f(zi, zt, t, b)) for k, f in forms.items()}
    grads = {k: jax.jit(jax.grad(f, argnums=(0, 1, 2, 3)))(zi, zt, t, b) for k, f in forms.items()}
    assert values["global"] > 0
    for k in ("gather", "chunked"):
        assert abs(values[k] - values["global"]) <= 1e-6 * max(1.0, values["global"]), (k, values)
        for g, want in zip(grads[k], grads["global"]):
            np.testing.assert_allclose(g, want, atol=1e-6)
