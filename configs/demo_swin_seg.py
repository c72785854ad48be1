"""Segmentation demo on a Swin: configs/demo_seg.py's data and recipe (the generated `digits_mosaic` set, 32x32 mosaics
of handwritten digits, 11 per-pixel classes) with a small Swin and its feature-pyramid head (models/swin_segmentation.py)
in place of the dense ViT.

2x2 patches give a 16x16 grid of width 32 in shifted 4x4 windows, merged to an 8x8 grid of width 64 (shifted 4x4
windows again) -- "Swin-32-2-2"; the head adds the upsampled second stage to the first and classifies each token's
2x2 pixels. Figures (mIoU, wall time, machine load) and the command are in docs/models.md; benchmarks/demo_swin_seg.sh
asserts them.

    python -m vit_jax.main --config=configs/demo_swin_seg.py --workdir=workdirs/demo_swin_seg
"""

import importlib.util
import os


def _demo_seg():
    spec = importlib.util.spec_from_file_location("demo_seg_config",
                                                  os.path.join(os.path.dirname(__file__), "demo_seg.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(arg=None):
    c = _demo_seg().get_config(arg)
    # The demo's ViT keys back at their defaults (a Swin has none of them; its stage outputs need no model.dense).
    c.model.width, c.model.depth, c.model.mlp_dim, c.model.num_heads = 0, 0, 0, 0
    c.model.pool, c.model.posemb, c.model.dense = "token", "learn", False
    c.model.variant = VARIANT
    c.model.patch_size = 2
    c.model.window_size = 4
    c.model.image_size = 32
    c.total_epochs = EPOCHS
    return c


VARIANT = "Swin-32-2-2"
EPOCHS = 12.0
