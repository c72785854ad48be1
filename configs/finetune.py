"""Fine-tuning as in the ViT paper (§3.2, Table 4 and Appendix B.1.1), from an official .npz or our checkpoint.

    python -m vit_jax.main --config=configs/finetune.py:dataset=cifar10,init=ViT-B_16.npz --workdir=...
    args: dataset=NAME, init=PATH, variant= (empty: the architecture of init), lr=, resolution=384 (mae: 224), steps=,
          train_split=, eval_split=, hyperrule= (bit: BiT-HyperRule, below), train_examples=, image_px=,
          recipe= (mae: the MAE fine-tuning recipe, below), batch=

dataset: any dataset vit_jax reads (digits, folder:/path, imagenet21k, any TFDS name); the paper's five below come
with its step counts and learning rates, any other gets 500 steps at lr 0.003 on train/test unless given.

Recipe: SGD with momentum 0.9, batch 512, no weight decay, global-norm clipping at 1, 500 warmup steps then cosine
decay, 384 px (the position embeddings are interpolated in 2D; patch size unchanged), a new zero-initialised
linear head (the pretraining pre-logits layer is dropped). Steps: 20k for ImageNet, 10k for CIFAR, 500 for Pets
and Flowers. The paper picks the learning rate from {0.001, 0.003, 0.01, 0.03} (ImageNet: {0.003, 0.01, 0.03,
0.06}) on a held-out split: configs/sweeps/finetune_lr.py runs that grid. Expected (paper Table 2, ViT-B/16 from
ImageNet-21k, 384 px): CIFAR-10 98.95%, CIFAR-100 91.67%, Pets 94.43%, Flowers 99.38%, ImageNet 83.97%.

BiT-HyperRule (`hyperrule=bit`; Kolesnikov et al., 2020, "Big Transfer" §3.3, and its release's bit_hyperrule.py),
the fine-tuning rule of the BiT ResNets: SGD momentum 0.9, batch 512, lr 0.003, no weight decay, no clipping; the
schedule length by training-set size (< 20k examples: 500 steps, < 500k: 10k, else 20k) with a linear warmup (100,
500, 500 steps) and the lr divided by 10 at the release's boundaries (200/300/400 of 500 steps; 30%, 60%, 90% of the
longer schedules); resolution by image area (< 96x96 px: resize to 160, random 128 crop; else resize to 448,
random 384 crop; evaluation resizes to the crop size); MixUp with alpha 0.1 from 20k examples on. The sizes of the
datasets in DATASET_SIZES are built in; for others give `train_examples=N,image_px=SIDE`.

MAE fine-tuning (`recipe=mae,variant=B/16|L/16|H/14`; He et al. 2022, appendix A.2 and the release's FINETUNE.md),
for an encoder pretrained by configs/vit_mae.py (class token, sin-cos position embeddings): AdamW b=(0.9, 0.999),
weight decay 0.05 (kernels), no gradient clipping, base lr x batch/256 (batch 1024), cosine decay to 0 after 5
warmup epochs, layer-wise lr decay (optimizer.layer_decay), drop path, 224 px, Inception crops, flips, RandAugment
(2 ops, magnitude 9), MixUp 0.8, label smoothing 0.1:
    B: base lr 5e-4, layer decay 0.65, drop path 0.1, 100 epochs (paper: 83.6% ImageNet top-1)
    L: base lr 1e-3, layer decay 0.75, drop path 0.2, 50 epochs (85.9%)
    H: base lr 1e-3, layer decay 0.75, drop path 0.3, 50 epochs (86.9% at 224 px)
`steps=` replaces the epochs (warmup: the same fraction, 5/100 or 5/50). Not supported here, so left out: CutMix
1.0 (with the paper's switch probability 0.5 against MixUp), random erasing 0.25, RandAugment's magnitude noise
(mstd 0.5), the lr floor 1e-6, and global-average pooling with fc_norm (the class token is kept: it is what
configs/vit_mae.py pretrains; the paper reports both pool the same within 0.1%).

Target topology (TARGETS below; compiled by the TPU compiler in benchmarks/preflight_configs.py, table in
docs/BENCHMARKS.md): B/16 at 384 px on TPU v3-32 (v3:4x4).
"""

from vit_jax.train.config import ConfigError, default_config, parse_config_args

DATASETS = {  # name: (train split, eval split, steps, default lr)
    "imagenet2012": ("train", "validation", 20_000, 0.03),
    "cifar10": ("train", "test", 10_000, 0.01),
    "cifar100": ("train", "test", 10_000, 0.01),
    "oxford_iiit_pet": ("train", "test", 500, 0.003),
    "oxford_flowers102": ("train", "test", 500, 0.003),
}
LR_GRID = {"imagenet2012": (0.003, 0.01, 0.03, 0.06)}
TARGETS = {"dataset=imagenet2012,variant=B/16": "v3:4x4"}
DEFAULT_LR_GRID = (0.001, 0.003, 0.01, 0.03)


OTHER_DATASET = ("train", "test", 500, 0.003)
# BiT-HyperRule inputs: training examples and (typical) image size of the source images. TFDS train splits; digits
# is the embedded scikit-learn set (8x8 scans stored at 32x32).
DATASET_SIZES = {
    "imagenet2012": (1_281_167, 224),
    "cifar10": (50_000, 32),
    "cifar100": (50_000, 32),
    "oxford_iiit_pet": (3_680, 224),
    "oxford_flowers102": (1_020, 224),
    "digits": (1_437, 32),
}


def bit_hyperrule(train_examples: int, image_px: int) -> dict:
    """BiT-HyperRule's fine-tuning settings for a dataset of `train_examples` images of about image_px x image_px.

    Returns steps, warmup_steps, staircase_at (fractions of steps where the lr is divided by 10), precrop and crop
    (resize, then random crop, in pixels) and mixup_alpha.
    """
    if train_examples < 1 or image_px < 1:
        raise ConfigError(f"BiT-HyperRule needs a positive dataset size and image size, got {train_examples}, "
                         f"{image_px}")
    if train_examples < 20_000:
        supports = (100, 200, 300, 400, 500)  # warmup end, three decays, end of training
    elif train_examples < 500_000:
        supports = (500, 3_000, 6_000, 9_000, 10_000)
    else:
        supports = (500, 6_000, 12_000, 18_000, 20_000)
    precrop, crop = (160, 128) if image_px * image_px < 96 * 96 else (448, 384)
    return dict(steps=supports[-1], warmup_steps=supports[0],
                staircase_at=tuple(s / supports[-1] for s in supports[1:4]),
                precrop=precrop, crop=crop, mixup_alpha=0.0 if train_examples < 20_000 else 0.1)


def get_config(arg=None):
    a = parse_config_args(arg, {"dataset": "cifar10", "init": "", "variant": "", "lr": "", "resolution": "",
                                "steps": "", "train_split": "", "eval_split": "", "hyperrule": "",
                                "train_examples": "", "image_px": "", "recipe": "", "batch": ""})
    train_split, eval_split, steps, lr = DATASETS.get(a["dataset"], OTHER_DATASET)
    train_split, eval_split = a["train_split"] or train_split, a["eval_split"] or eval_split
    steps = int(a["steps"] or steps)
    res = int(a["resolution"] or 384)
    c = default_config()
    c.model.variant = a["variant"]
    c.model.image_size = res
    c.model.pool = "token"
    c.model.rep_size = 0  # the pretraining pre-logits layer is dropped (init.reinit replaces the head)
    c.model.dtype = "bfloat16"
    c.init.checkpoint = a["init"]
    c.init.required = True  # fine-tuning from random weights is a mistake, not a default
    c.init.reinit = ("head",)
    c.init.posemb_resize = "bicubic"
    c.data.name = a["dataset"]
    c.data.train_split, c.data.eval_split = train_split, eval_split
    c.data.pp_train = f"decode_jpeg_and_inception_crop({res})|flip_lr|value_range(-1,1)"
    c.data.pp_eval = f"decode|resize({res})|value_range(-1,1)"
    c.batch_size = int(a["batch"] or 512)
    c.total_steps = steps
    c.optimizer.name = "sgd"
    c.optimizer.momentum = 0.9
    c.optimizer.lr = float(a["lr"] or lr)
    c.optimizer.weight_decay = 0.0
    c.optimizer.grad_clip_norm = 1.0
    c.optimizer.warmup_steps = min(500, steps // 10)
    c.optimizer.schedule = "cosine"
    if a["hyperrule"] and a["recipe"]:
        raise ConfigError("give hyperrule= or recipe=, not both: each sets the whole fine-tuning schedule")
    if a["hyperrule"] == "bit":
        _apply_bit_hyperrule(c, a)
    elif a["hyperrule"]:
        raise ConfigError(f"hyperrule={a['hyperrule']}: the only rule is 'bit' (BiT-HyperRule)")
    c.log_every_steps = 50
    if a["recipe"] == "mae":
        _apply_mae_recipe(c, a)
    elif a["recipe"]:
        raise ConfigError(f"recipe={a['recipe']}: the only recipe is 'mae' (MAE fine-tuning)")
    else:
        c.eval.every_steps = max(c.total_steps // 10, 50)
        c.checkpoint.every_steps = max(c.total_steps // 10, 50)
    return c


# MAE fine-tuning by model size: base lr (x batch/256), layer decay, drop path, epochs (release FINETUNE.md).
MAE_RECIPE = {"B": (5e-4, 0.65, 0.1, 100), "L": (1e-3, 0.75, 0.2, 50), "H": (1e-3, 0.75, 0.3, 50)}


def _apply_mae_recipe(c, a: dict) -> None:
    size = a["variant"].split("/")[0]
    if size not in MAE_RECIPE:
        raise ConfigError(f"recipe=mae needs variant=B/16, L/16 or H/14 (its lr, layer decay, drop path and epochs "
                          f"depend on the size), got variant={a['variant']!r}")
    base_lr, layer_decay, drop_path, epochs = MAE_RECIPE[size]
    c.batch_size = int(a["batch"] or 1024)
    res = int(a["resolution"] or 224)
    c.model.image_size = res
    c.model.posemb = "sincos2d"  # as configs/vit_mae.py pretrains it
    c.model.drop_path = drop_path
    c.init.posemb_resize = "bicubic"
    c.data.pp_train = f"decode_jpeg_and_inception_crop({res})|flip_lr|randaug(2,9)|value_range(-1,1)"
    c.data.pp_eval = f"decode|resize_small({res * 256 // 224})|central_crop({res})|value_range(-1,1)"
    o = c.optimizer
    o.name, o.b1, o.b2, o.eps = "adamw", 0.9, 0.999, 1e-8
    o.lr = float(a["lr"] or base_lr * c.batch_size / 256)
    o.weight_decay, o.decay_mask, o.grad_clip_norm = 0.05, "kernels", 0.0
    o.schedule, o.end_lr_factor = "cosine", 0.0
    o.layer_decay = layer_decay
    c.loss.mixup_alpha, c.loss.label_smoothing = 0.8, 0.1
    if a["steps"]:  # a step count replaces the epochs; warmup keeps the recipe's fraction of training
        c.total_steps, c.total_epochs = int(a["steps"]), 0.0
        o.warmup_steps, o.warmup_epochs = int(c.total_steps * 5 / epochs), 0.0
        c.eval.every_steps = c.checkpoint.every_steps = max(c.total_steps // 10, 50)
    else:
        c.total_steps, c.total_epochs = 0, float(epochs)
        o.warmup_steps, o.warmup_epochs = 0, 5.0
        c.eval.every_steps = c.checkpoint.every_steps = 0
        c.eval.every_epochs = c.checkpoint.every_epochs = epochs / 10


def _apply_bit_hyperrule(c, a: dict) -> None:
    known = DATASET_SIZES.get(a["dataset"])
    if not (a["train_examples"] and a["image_px"]) and known is None:
        raise ConfigError(f"hyperrule=bit on {a['dataset']}: give its size, e.g. train_examples=12000,image_px=224 "
                         f"(built in: {', '.join(DATASET_SIZES)})")
    examples = int(a["train_examples"] or known[0])
    image_px = int(a["image_px"] or known[1])
    rule = bit_hyperrule(examples, image_px)
    c.total_steps = int(a["steps"] or rule["steps"])
    c.model.image_size = rule["crop"]
    c.data.pp_train = f"decode|resize({rule['precrop']})|random_crop({rule['crop']})|flip_lr|value_range(-1,1)"
    c.data.pp_eval = f"decode|resize({rule['crop']})|value_range(-1,1)"
    c.optimizer.lr = float(a["lr"] or 0.003)
    c.optimizer.grad_clip_norm = 0.0
    c.optimizer.warmup_steps = rule["warmup_steps"]
    c.optimizer.schedule = "staircase"
    c.optimizer.staircase_at = rule["staircase_at"]
    c.optimizer.staircase_factor = 0.1
    c.loss.mixup_alpha = rule["mixup_alpha"]
