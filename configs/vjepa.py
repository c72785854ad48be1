"""V-JEPA pretraining without labels (Bardes et al., 2024): a joint video ViT-L/16 with 2-frame tubelets learns by
predicting, from the visible tubelets, the EMA target encoder's features of masked spatio-temporal blocks
(objective `vjepa`, train/objectives/vjepa.py; its settings `vjepa.*` default to the paper's).

    python -m vit_jax.main --config=configs/vjepa.py:data=NAME --workdir=...
    args: data=NAME (a TFDS dataset whose `image` holds each clip's frames stacked vertically, the layout decode_clip
    reads), frames=NUM stored frames per example (default 16), batch=, steps=.

Recipe values (facebookresearch/jepa configs/pretrain/vitl16.yaml, app/vjepa/train.py): 16 frames, tubelet 2, 224
px; predictor 12 blocks of width 384; masks 8 blocks of 15% (short-range) and 2 of 70% (long-range), aspect
0.75-1.5, over the whole clip; L1 loss on layer-normalised targets; target EMA 0.998 -> 1.0 linear; AdamW lr 6.25e-4,
gradient clipping at 10, bfloat16.

Differences: the weight decay stays at 0.04 (the paper raises it to 0.4 on a cosine schedule; the optimizer has no
weight-decay schedule), the encoder's position embedding is learned (jepa's is a fixed 3D sin-cos; the predictor's is
fixed here too), masks have a fixed size (the blocks' expected coverage) where jepa truncates each batch to its
smallest mask, and batch and length are arguments (the defaults are not the paper's pod-scale run).
"""

from vit_jax.train.config import default_config, parse_config_args


def get_config(arg=None):
    a = parse_config_args(arg, {"data": "kinetics400", "frames": "16", "batch": "256", "steps": "90000"})
    c = default_config()
    c.objective = "vjepa"
    c.model.variant = "ViViT-L/16x2"
    c.model.num_frames = 16
    c.model.image_size = 224
    c.model.pool = "gap"
    c.model.video_encoder = "joint"
    c.model.dtype = "bfloat16"
    c.data.name = a["data"]
    c.data.train_split, c.data.eval_split = "train", "validation"
    c.data.pp_train = f"decode_clip({a['frames']})|sample_clip(16, stride=4)|random_crop_clip(224)|value_range(-1,1)"
    c.data.pp_eval = (f"decode_clip({a['frames']})|sample_clip(16, stride=4, random=False)|central_crop_clip(224)|"
                      "value_range(-1,1)")
    c.batch_size = int(a["batch"])
    c.total_steps = int(a["steps"])
    c.optimizer.name = "adamw"
    c.optimizer.lr = 6.25e-4
    c.optimizer.weight_decay = 0.04
    c.optimizer.schedule = "cosine"
    c.optimizer.warmup_steps = c.total_steps // 8
    c.optimizer.grad_clip_norm = 10.0
    c.eval.evaluators = ("vjepa",)
    c.log_every_steps = 100
    c.eval.every_steps = 5_000
    c.checkpoint.every_steps = 2_000
    return c
