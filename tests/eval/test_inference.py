"""build_inference: a checkpoint's parameters placed on a data x fsdp mesh compute what the unsharded model does."""

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.eval.inference import build_inference
from vit_jax.models import vit_config
from vit_jax.models.vit import FunctionalViT
from vit_jax.parallel.mesh import make_mesh


def test_sharded_inference_equals_the_plain_model():
    cfg = vit_config(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8, image_size=16, num_classes=5)
    params = jax.device_get(FunctionalViT(cfg).init(jax.random.key(0)))
    program = build_inference(cfg, params, make_mesh(data=jax.device_count() // 2, fsdp=2))
    kernel = program.params["head"]["kernel"]
    assert kernel.sharding == program.param_sh["head"]["kernel"]  # placed as the rules say
    images = np.random.default_rng(0).uniform(-1, 1, (program.global_batch(8), 16, 16, 3)).astype(np.float32)
    want_logits, want_out = program.model.apply(params, jnp.asarray(images))
    np.testing.assert_allclose(program.logits()(program.params, images), want_logits, atol=1e-5)
    np.testing.assert_allclose(program.features()(program.params, images), want_out["pre_logits"], atol=1e-5)
    n = program.mesh.size  # batches are whole examples per device: rounded down, at least one each
    assert (program.global_batch(3), program.global_batch(2 * n + 3)) == (n, 2 * n)
