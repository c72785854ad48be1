"""Fine-tuning as in the ViT paper (§3.2, Table 4 and Appendix B.1.1), from an official .npz or our checkpoint.

    python -m vit_jax.main --config=configs/finetune.py:dataset=cifar10,init=ViT-B_16.npz --workdir=...
    args: dataset=NAME, init=PATH, variant= (empty: the architecture of init), lr=, resolution=384, steps=,
          train_split=, eval_split=

dataset: any dataset vit_jax reads (digits, folder:/path, imagenet21k, any TFDS name); the paper's five below come
with its step counts and learning rates, any other gets 500 steps at lr 0.003 on train/test unless given.

Recipe: SGD with momentum 0.9, batch 512, no weight decay, global-norm clipping at 1, 500 warmup steps then cosine
decay, 384 px (the position embeddings are interpolated in 2D; patch size unchanged), a new zero-initialised
linear head (the pretraining pre-logits layer is dropped). Steps: 20k for ImageNet, 10k for CIFAR, 500 for Pets
and Flowers. The paper picks the learning rate from {0.001, 0.003, 0.01, 0.03} (ImageNet: {0.003, 0.01, 0.03,
0.06}) on a held-out split: configs/sweeps/finetune_lr.py runs that grid. Expected (paper Table 2, ViT-B/16 from
ImageNet-21k, 384 px): CIFAR-10 98.95%, CIFAR-100 91.67%, Pets 94.43%, Flowers 99.38%, ImageNet 83.97%.
"""

from vit_jax.train.config import default_config, parse_config_args

DATASETS = {  # name: (train split, eval split, steps, default lr)
    "imagenet2012": ("train", "validation", 20_000, 0.03),
    "cifar10": ("train", "test", 10_000, 0.01),
    "cifar100": ("train", "test", 10_000, 0.01),
    "oxford_iiit_pet": ("train", "test", 500, 0.003),
    "oxford_flowers102": ("train", "test", 500, 0.003),
}
LR_GRID = {"imagenet2012": (0.003, 0.01, 0.03, 0.06)}
DEFAULT_LR_GRID = (0.001, 0.003, 0.01, 0.03)


OTHER_DATASET = ("train", "test", 500, 0.003)


def get_config(arg=None):
    a = parse_config_args(arg, {"dataset": "cifar10", "init": "", "variant": "", "lr": "", "resolution": "384",
                                "steps": "", "train_split": "", "eval_split": ""})
    train_split, eval_split, steps, lr = DATASETS.get(a["dataset"], OTHER_DATASET)
    train_split, eval_split = a["train_split"] or train_split, a["eval_split"] or eval_split
    steps = int(a["steps"] or steps)
    res = int(a["resolution"])
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
    c.batch_size = 512
    c.total_steps = steps
    c.optimizer.name = "sgd"
    c.optimizer.momentum = 0.9
    c.optimizer.lr = float(a["lr"] or lr)
    c.optimizer.weight_decay = 0.0
    c.optimizer.grad_clip_norm = 1.0
    c.optimizer.warmup_steps = min(500, steps // 10)
    c.optimizer.schedule = "cosine"
    c.log_every_steps = 50
    c.eval.every_steps = max(steps // 10, 50)
    c.checkpoint.every_steps = max(steps // 10, 50)
    return c
