"""ImageNet-21k pretraining of a BiT ResNet-v2 with BiT's own recipe (Kolesnikov et al., 2020, "Big Transfer", §3.3).

    python -m vit_jax.main --config=configs/bit_i21k.py:variant=BiT-R50x1 --workdir=gs://bucket/bit_r50x1_i21k
    args: variant=BiT-R50x1|BiT-R101x3|BiT-R152x4|..., epochs=90

Recipe (BiT-M, upstream): SGD with momentum 0.9, batch 4096, learning rate 0.03 x batch/256 (0.48) after a linear
warmup of 5000 steps, divided by 10 at epochs 30, 60 and 80 of 90 (the `staircase` schedule), weight decay 1e-4, no
gradient clipping, 224 px inception crops with horizontal flips. BiT-HyperRule fine-tuning: configs/finetune.py with
`hyperrule=bit` (no weight decay there).

BiT adds its weight decay to the gradient before the momentum (coupled L2); ours is decoupled, added to the update
after the momentum (optax's convention). With momentum 0.9 the coupled term is amplified 1 / (1 - 0.9) = 10 times in
steady state, so BiT's 1e-4 is 1e-3 here. As in every config, only kernels are decayed (`optimizer.decay_mask`).

The ViT paper's own ResNet baselines (Table 6) were trained with Adam instead (its Appendix D.1):
configs/vit_i21k.py:variant=BiT-R50x1, which configs/sweeps/paper_scaling.py uses.
"""

from vit_jax.models.bit_config import is_bit_name
from vit_jax.train.config import default_config, parse_config_args

BATCH = 4096


def get_config(arg=None):
    a = parse_config_args(arg, {"variant": "BiT-R50x1", "epochs": "90"})
    if not is_bit_name(a["variant"]):
        raise ValueError(f"variant={a['variant']} is not a BiT ResNet (e.g. BiT-R50x1, BiT-R152x2): ViTs train with "
                         "configs/vit_i21k.py")
    epochs = float(a["epochs"])
    c = default_config()
    c.model.variant = a["variant"]
    c.model.image_size = 224
    c.model.dtype = "bfloat16"
    c.data.name = "imagenet21k/fall11"
    c.data.train_split, c.data.eval_split = "train", "validation"
    c.data.pp_train = "decode_jpeg_and_inception_crop(224)|flip_lr|value_range(-1,1)"
    c.data.pp_eval = "decode|resize_small(256)|central_crop(224)|value_range(-1,1)"
    c.batch_size = BATCH
    c.total_epochs = epochs
    c.loss.kind = "sigmoid_xent"  # multi-hot i21k labels, as configs/vit_i21k.py
    c.optimizer.name = "sgd"
    c.optimizer.momentum = 0.9
    c.optimizer.lr = 0.03 * BATCH / 256
    c.optimizer.weight_decay = 1e-3  # BiT's coupled 1e-4 under momentum 0.9 (see above)
    c.optimizer.grad_clip_norm = 0.0
    c.optimizer.warmup_steps = 5_000
    c.optimizer.schedule = "staircase"
    c.optimizer.staircase_at = tuple(e / 90 for e in (30, 60, 80))  # of a 90-epoch run; scaled with `epochs`
    c.optimizer.staircase_factor = 0.1
    c.log_every_steps = 100
    c.eval.every_steps = 10_000
    c.checkpoint.every_steps = 2_000
    c.checkpoint.keep = 3
    c.checkpoint.keep_every_steps = 50_000
    return c
