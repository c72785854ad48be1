"""Segmentation fine-tuning on TFDS `oxford_iiit_pet` (Parkhi et al. 2012): the trimaps, 3 classes per pixel.

    python -m vit_jax.main --config=configs/seg_oxford_pets.py:init=ViT-B_16.npz --workdir=...
    python -m vit_jax.main --config=configs/seg_oxford_pets.py:variant=Swin-T,init=swin_tiny.safetensors --workdir=...
    args: init=PATH (a classification checkpoint: official .npz, timm .safetensors or one of our runs), variant=B/16
          (or a Swin: Swin-T, Swin-S, ...), resolution=224, steps=3000, lr=3e-4

The data needs `vit-jax prepare-data oxford_iiit_pet --download` (network) once. Its `segmentation_mask` holds 1 = pet,
2 = background, 3 = border; `decode_mask('segmentation_mask', offset=-1)` makes them classes 0, 1, 2 (train 3,680 /
test 3,669 images). The model: the checkpoint's encoder as a dense backbone (class token, final LayerNorm and head
dropped; position embeddings resized to the grid) and a new pixel head (models/segmentation.py); with a Swin variant,
the checkpoint's Swin (final LayerNorm and head dropped) and a new feature-pyramid head over its four stages
(models/swin_segmentation.py; window 7, a resolution divisible by 32; e.g. timm's swin_tiny_patch4_window7_224 state
dict, read directly). AdamW with cosine decay, Inception crops (at least half the image) and flips, applied to image and trimap alike. This recipe is not run
here (the dataset cannot be downloaded on the development machine): no result is claimed for it.
"""

from vit_jax.models.swin_config import is_swin_name
from vit_jax.train.config import default_config, parse_config_args

DEFAULTS = {"init": "", "variant": "B/16", "resolution": "224", "steps": "3000", "lr": "3e-4"}


def get_config(arg=None):
    a = parse_config_args(arg, DEFAULTS)
    res = int(a["resolution"])
    c = default_config()
    c.objective = "segmentation"
    c.segmentation.num_classes = 3
    c.model.variant = a["variant"]
    c.model.image_size = res
    if is_swin_name(a["variant"]):  # its four stage outputs are the dense features: no ViT pooling/dense keys
        c.model.window_size = 7
    else:
        c.model.pool = "gap"
        c.model.dense = True
    c.init.checkpoint = a["init"]
    c.init.required = True
    c.data.name = "oxford_iiit_pet"
    c.data.train_split, c.data.eval_split = "train", "test"
    mask = "decode_mask('segmentation_mask', offset=-1)"
    c.data.pp_train = f"decode|{mask}|inception_crop({res}, area_min=50)|flip_lr|value_range(-1,1)"
    c.data.pp_eval = f"decode|{mask}|resize({res})|value_range(-1,1)"
    c.batch_size = 32
    c.total_steps = int(a["steps"])
    c.optimizer.name = "adamw"
    c.optimizer.lr = float(a["lr"])
    c.optimizer.weight_decay = 0.05
    c.optimizer.warmup_steps = 200
    c.optimizer.schedule = "cosine"
    c.optimizer.grad_clip_norm = 1.0
    c.eval.evaluators = ("segmentation",)
    c.eval.every_steps = 500
    c.checkpoint.every_steps = 500
    return c
