"""DeiT (Touvron et al. 2021, "Training data-efficient image transformers & distillation through attention"):
ViT-Ti/S/B trained on ImageNet-1k alone for 300 epochs, optionally distilled from a convnet teacher through the
distillation token.

    python -m vit_jax.main --config=configs/deit.py:variant=S --workdir=...
    python -m vit_jax.main --config=configs/deit.py:variant=B,distill=hard,teacher=/path/regnety_160.safetensors ...
    args: variant=Ti|S|B, distill=none|hard|soft, teacher=CHECKPOINT, epochs=300, ema=0

The recipe is the paper's Table 9 (DeiT-B column; Ti and S use the same): batch 1024 (1032 here, see below), AdamW
with lr 5e-4 x batch / 512 (~1e-3), weight decay 0.05, 5 warmup epochs, cosine decay, label smoothing 0.1, no
dropout, stochastic depth 0.1, repeated augmentation (3 copies), RandAugment m9 with 2 ops, mixup 0.8 and CutMix 1.0
switched per batch with probability 0.5 (timm's Mixup defaults in DeiT's main.py), random erasing 0.25, no gradient
clipping, no EMA, 224 px, class token and learned position embeddings. Reported top-1 on ImageNet-1k val at 224 px:
DeiT-Ti 72.2%, DeiT-S 79.8%, DeiT-B 81.8%; with hard distillation from RegNetY-16GF (82.9%) through the
distillation token: 74.5% / 81.2% / 83.4% (Table 5). ema=0.99996 keeps DeiT's main.py `--model-ema` (its default
decay) as EMA weights, which are then what the run evaluates and ships (train/ema.py).

Distillation (distill=hard|soft) adds the distillation token (model.distilled: two heads, averaged to predict) and
the `distillation` objective: `hard` is the paper's best (alpha 0.5: half cross-entropy with the labels on the class
head, half with the teacher's top class on the distillation head), `soft` its KL at tau 3.0 with alpha 0.1 (section
5.1). The teacher is any checkpoint vit_jax reads; the paper's RegNetY is not a family here, so a BiT ResNet or a ViT
stands in for it (configs/distill.py has big_vision's recipe for those).

RandAugment here is ours (randaug(2, 9)), without timm's magnitude noise (mstd 0.5); random erasing (p 0.25) is
data/erasing.py's per-pixel noise on the [-1, 1] image (DeiT's on the mean/std-normalised one).
"""

from vit_jax.train.config import default_config, parse_config_args

WIDTHS = {"Ti": (192, 3), "S": (384, 6), "B": (768, 12)}  # width, heads; depth 12 and MLP 4x width for all three


def get_config(arg=None):
    a = parse_config_args(arg, {"variant": "S", "distill": "none", "teacher": "", "epochs": "300", "ema": "0"})
    if a["variant"] not in WIDTHS:
        raise ValueError(f"variant={a['variant']}: DeiT comes as Ti, S or B")
    c = default_config()
    c.ema.decay = float(a["ema"])
    c.model.variant = f"{a['variant']}/16"
    c.model.image_size = 224
    c.model.dtype = "bfloat16"
    c.model.pool, c.model.posemb = "token", "learn"
    c.model.drop_path = 0.1
    c.data.name = "imagenet2012"
    c.data.train_split, c.data.eval_split = "train", "validation"
    # DeiT's eval: resize to 256 (crop ratio 0.875) and a central 224 crop; train: random-resized crop (scale
    # 0.08-1), flips, RandAugment, random erasing, then mixup/CutMix on device.
    c.data.pp_train = ("decode_jpeg_and_inception_crop(224, area_min=8)|flip_lr|randaug(2,9)|value_range(-1,1)"
                       "|random_erasing(0.25)")
    c.data.pp_eval = "decode|resize_small(256)|central_crop(224)|value_range(-1,1)"
    c.data.repeated_augmentation = 3
    # DeiT's 1024 is not a multiple of 3: its sampler lets an image's copies straddle two steps. Ours keeps them in
    # one global batch, so the batch is the nearest size that 3 copies and 8 devices both divide (3 x 344 = 8 x 129).
    c.batch_size = 1032
    c.total_epochs = float(a["epochs"])
    c.optimizer.name = "adamw"
    c.optimizer.lr = 5e-4 * c.batch_size / 512
    c.optimizer.weight_decay = 0.05
    c.optimizer.warmup_epochs = 5.0
    c.optimizer.schedule = "cosine"
    c.optimizer.grad_clip_norm = 0.0
    c.loss.label_smoothing = 0.1
    c.loss.mixup_alpha, c.loss.cutmix_alpha, c.loss.cutmix_switch_prob = 0.8, 1.0, 0.5
    c.log_every_steps = 100
    c.eval.every_epochs = 5.0
    c.checkpoint.every_steps = 2_000
    if a["distill"] != "none":
        if a["distill"] not in ("hard", "soft"):
            raise ValueError(f"distill={a['distill']}: use none, hard or soft")
        c.model.distilled = True
        c.objective = "distillation"
        c.eval.evaluators = ("distillation",)
        c.distill.teacher = a["teacher"]
        c.distill.mode = a["distill"]
        c.distill.alpha, c.distill.temperature = (0.5, 1.0) if a["distill"] == "hard" else (0.1, 3.0)
    return c
