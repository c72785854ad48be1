"""Step 1 of the timm parity check (run with vit_jax's environment): tiny random ViTs exported for timm.

Writes, for each case, `<case>.safetensors` (timm layout, `vit-jax convert --to timm`'s writer), the input images and
our logits; the hybrid case is written in the official .npz layout instead, which timm reads with its own loader.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_jax.checkpoints.npz import save_npz_params
from vit_jax.checkpoints.timm import save_timm
from vit_jax.models import vit_config
from vit_jax.models.vit import FunctionalViT

CASES = {
    "token_tanh": dict(pool="token", gelu="tanh", image_size=32, patch_size=8),
    "gap_tanh": dict(pool="gap", gelu="tanh", image_size=32, patch_size=8),
    "map_erf": dict(pool="map", gelu="erf", image_size=32, patch_size=8),
    "token_rect": dict(pool="token", gelu="tanh", image_size=(32, 48), patch_size=8),
    "hybrid": dict(pool="token", gelu="tanh", image_size=64, patch_size=1, resnet_layers=(1, 1)),
    "hybrid_root": dict(pool="token", gelu="tanh", image_size=64, patch_size=8, resnet_layers=(0,)),  # R+ViT-Ti
}


def main(out: str) -> None:
    rng = np.random.default_rng(0)
    for name, kw in CASES.items():
        cfg = vit_config(width=48, depth=2, mlp_dim=96, num_heads=3, num_classes=7, **kw)
        with nnx.use_eager_sharding(False):
            model = FunctionalViT(cfg)
            params = model.init(jax.random.key(0))
        # Random weights everywhere (the zero-initialised head would hide most of the function).
        params = jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.2, x.shape), x.dtype), params)
        h, w = cfg.image_size
        images = rng.uniform(-1, 1, (3, h, w, 3)).astype(np.float32)
        logits, _ = model.apply(params, jnp.asarray(images))
        if cfg.resnet_layers:
            save_npz_params(f"{out}/{name}.npz", params, cfg, layout="official")
        else:
            save_timm(f"{out}/{name}.safetensors", params, cfg)
        np.save(f"{out}/{name}_images.npy", images)
        np.save(f"{out}/{name}_logits.npy", np.asarray(logits))


if __name__ == "__main__":
    main(sys.argv[1])
