"""Demo: a small ViT trained from scratch on the embedded `digits` dataset (scikit-learn's handwritten digits).

The main job of the README (`make demo`): it exercises the whole path — dataset build, sharded training over all
local devices, evaluation, checkpoints, metrics (TensorBoard + metrics.jsonl), summary.json and the curve plot —
in about two minutes on 2 CPU cores. Expected result: >= 95% test accuracy (360 test images, 10 classes).

    python -m vit_jax.main --config=configs/demo.py --workdir=workdirs/demo
"""

from vit_jax.train.config import default_config


def get_config(arg=None):
    del arg
    c = default_config()
    c.seed = 0
    c.model.variant = ""  # custom size below: 4 blocks of width 96 on 4x4 patches of 32x32 images
    c.model.width, c.model.depth, c.model.mlp_dim, c.model.num_heads = 96, 4, 192, 3
    c.model.patch_size = 4
    c.model.image_size = 32
    c.model.pool = "gap"
    c.model.posemb = "learn"
    c.data.name = "digits"
    c.data.train_split, c.data.eval_split = "train", "test"
    # Digits are not mirror-symmetric: no flips. Light translation via a padded random crop.
    c.data.pp_train = "decode|resize(36)|random_crop(32)|value_range(-1,1)"
    c.data.pp_eval = "decode|value_range(-1,1)"
    c.batch_size = 128
    c.total_epochs = 40.0
    c.optimizer.name = "adamw"
    c.optimizer.lr = 2e-3
    c.optimizer.weight_decay = 0.05
    c.optimizer.warmup_epochs = 2.0
    c.optimizer.schedule = "cosine"
    c.optimizer.grad_clip_norm = 1.0
    c.loss.label_smoothing = 0.1
    c.log_every_steps = 50
    c.eval.every_epochs = 10.0
    c.checkpoint.every_epochs = 10.0
    c.eval.fewshot.datasets = ("digits",)
    c.eval.fewshot.shots = (1, 5, 10)
    c.eval.fewshot.every_epochs = 20.0
    return c
