"""Demo: a small Swin Transformer trained from scratch on the embedded `digits` dataset (configs/demo.py's data and
recipe, another model family).

At the demo's 16x16 resolution a Swin's 4x4 patches would leave a 4x4 grid and nothing to shift; 2x2 patches give an
8x8 grid of width 32 in 4x4 windows (the second block shifted by 2, under the mask), merged to a 4x4 grid of width 64
(one window: no shift) -- "Swin-32-2-2", 2 + 2 blocks. Figures (accuracy, wall time, machine) and the command are in
docs/models.md; benchmarks/demo_swin.sh asserts them.

    python -m vit_jax.main --config=configs/demo_swin.py --workdir=workdirs/demo_swin
"""

import importlib.util
import os


def _demo():
    spec = importlib.util.spec_from_file_location("demo_config", os.path.join(os.path.dirname(__file__), "demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(arg=None):
    c = _demo().get_config(arg)
    # The demo's ViT keys back at their defaults (a Swin has none of them), then the Swin.
    c.model.width, c.model.depth, c.model.mlp_dim, c.model.num_heads, c.model.pool = 0, 0, 0, 0, "token"
    c.model.variant = "Swin-32-2-2"
    c.model.patch_size = 2
    c.model.window_size = 4
    c.model.image_size = 16
    c.total_epochs = EPOCHS
    return c


EPOCHS = 60.0
