"""ImageNet-1k from scratch: the Swin Transformer paper's 300-epoch AdamW recipe (Liu et al., 2021, §4.1 and its
appendix A2.1; the values of the official repository's config.py and configs/swin/*.yaml).

    python -m vit_jax.main --config=configs/swin_i1k.py:variant=Swin-T --workdir=...
    args: variant=Swin-T|Swin-S|Swin-B|Swin-L, epochs=...

Reported top-1 at 224 px (paper Table 1a): Swin-T 81.3%, Swin-S 83.0%, Swin-B 83.5%.

Target topology (TARGETS below; compiled by the TPU compiler in benchmarks/preflight_configs.py, table in
docs/BENCHMARKS.md): a TPU v5e 2x2 (v5e:2x2), 4 chips, 256 images each: `vit-jax plan --config configs/swin_i1k.py
--topology v5e:2x2` (docs/models.md has the result).
"""

from vit_jax.errors import ConfigError
from vit_jax.train.config import default_config, parse_config_args

# Stochastic depth per model (configs/swin/swin_{tiny,small,base}_patch4_window7_224.yaml; Swin-L is trained on
# ImageNet-22k in the paper, where it uses 0.2).
DROP_PATH = {"Swin-T": 0.2, "Swin-S": 0.3, "Swin-B": 0.5, "Swin-L": 0.2}
TARGETS = {"variant=Swin-T": "v5e:2x2"}


def get_config(arg=None):
    a = parse_config_args(arg, {"variant": "Swin-T", "epochs": ""})
    if a["variant"] not in DROP_PATH:
        raise ConfigError(f"configs/swin_i1k.py:variant={a['variant']}: use one of {', '.join(DROP_PATH)}")
    c = default_config()
    c.model.variant = a["variant"]
    c.model.image_size = 224
    c.model.window_size = 7
    c.model.drop_path = DROP_PATH[a["variant"]]
    c.model.dtype = "bfloat16"
    c.data.name = "imagenet2012"
    c.data.train_split, c.data.eval_split = "train", "validation"
    # RandAugment rand-m9-mstd0.5-inc1: two ops of magnitude 9 (the magnitude noise is not modelled); random erasing
    # with probability 0.25 (config.py's REPROB; data/erasing.py: per-pixel normal noise, as the repository's timm).
    c.data.pp_train = ("decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2,9)|value_range(-1,1)"
                       "|random_erasing(0.25)")
    c.data.pp_eval = "decode|resize_small(256)|central_crop(224)|value_range(-1,1)"  # crop ratio 0.875
    c.batch_size = 1024
    c.total_epochs = float(a["epochs"] or 300)
    c.optimizer.name = "adamw"
    c.optimizer.lr = 1e-3  # 5e-4 per 512 images, scaled linearly to the batch of 1024
    c.optimizer.weight_decay = 0.05
    c.optimizer.warmup_epochs = 20.0
    c.optimizer.schedule = "cosine"
    c.optimizer.end_lr_factor = 5e-6 / 1e-3  # MIN_LR 5e-6 at the batch of 512 -> 1e-5 here (the same fraction)
    c.optimizer.grad_clip_norm = 5.0
    c.loss.label_smoothing = 0.1
    c.loss.mixup_alpha, c.loss.cutmix_alpha, c.loss.cutmix_switch_prob = 0.8, 1.0, 0.5
    c.log_every_steps = 100
    c.eval.every_epochs = 5.0
    c.checkpoint.every_steps = 2_000
    return c
