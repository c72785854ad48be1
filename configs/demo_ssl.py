"""Label-free pretraining demo: MAE on the embedded digits, fine-tuned on 10% of the labels, against training from
scratch on those labels with the same total compute. One command, three stages (vit_jax/train/stages.py):

    python -m vit_jax.main --config=configs/demo_ssl.py --workdir=workdirs/demo_ssl
    args: seed=0

1. `pretrain`: MAE (objective "mae") on all 1,437 training images, labels unused; the reconstruction loss on the
   test images is its evaluation.
2. `finetune`: the pretrained encoder (init.checkpoint = WORKDIR/pretrain, a new zero head) trained on train[:10%]
   (144 labelled images).
3. `scratch`: the same model and fine-tuning recipe from random initialisation on the same 144 images, for as many
   epochs as make its training FLOPs equal to pretraining + fine-tuning together (models/flops.py).

WORKDIR/summary.json holds `ssl_finetune_top1` and `scratch_top1` (test accuracy, 360 images) and each stage's
summary. Measured numbers, time and seeds: docs/ssl.md.
"""

from pathlib import Path

from vit_jax.models.build import model_flops
from vit_jax.models.flops import mae_flops
from vit_jax.models.mae import MAEConfig
from vit_jax.train.config import config_module, model_config, parse_config_args

# digits' split sizes (vit_jax/data/digits.py; tests/train/test_demo_ssl_config.py checks them against the data):
# train[:10%] is 144 of the 1,437 training images.
TRAIN_EXAMPLES, LABELLED_EXAMPLES, NUM_CLASSES = 1437, 144, 10
PRETRAIN_EPOCHS, FINETUNE_EPOCHS = 200.0, 200.0


def get_config(arg=None):
    a = parse_config_args(arg, {"seed": "0"})
    # The demo's encoder, data and preprocessing (configs/demo.py: AdamW, wd 0.05, cosine, clip 1, label smoothing
    # 0.1), with fixed 2-D sin-cos position embeddings, as MAE's recipe has them.
    c = config_module(Path(__file__).with_name("demo.py")).get_config()
    c.seed = int(a["seed"])
    c.model.posemb = "sincos2d"
    c.data.train_split = "train[:10%]"
    # The fine-tuning recipe, shared by `finetune` and `scratch`: small batches for 144 images.
    c.batch_size = 32
    c.total_epochs = FINETUNE_EPOCHS
    c.optimizer.lr = 1e-3
    c.optimizer.warmup_epochs = 5.0
    c.log_every_steps = 100
    c.eval.every_epochs = 0.0  # evaluated once, at the end of each stage
    c.checkpoint.every_epochs = 50.0
    c.eval.fewshot.datasets, c.eval.fewshot.every_epochs = (), 0.0  # no few-shot probe in this demo

    mae = dict(mask_ratio=0.75, decoder_width=64, decoder_depth=2, decoder_heads=4, decoder_mlp_dim=128,
               norm_pix_loss=True)
    c.mae.update(mae)
    pretrain = {
        "objective": "mae", "data.train_split": "train", "eval.evaluators": ("reconstruction",),
        "loss.label_smoothing": 0.0, "batch_size": 128, "total_epochs": PRETRAIN_EPOCHS,
        "optimizer.lr": 2e-3, "optimizer.b2": 0.95, "optimizer.warmup_epochs": 10.0, "optimizer.grad_clip_norm": 0.0,
        "checkpoint.every_epochs": 100.0,
    }
    # Equal compute: the from-scratch run trains for as many image-steps as pretraining and fine-tuning together.
    mae_train = mae_flops(model_config(c, 0), MAEConfig(**mae)).train
    cls_train = model_flops(model_config(c, NUM_CLASSES)).train
    spent = PRETRAIN_EPOCHS * TRAIN_EXAMPLES * mae_train + FINETUNE_EPOCHS * LABELLED_EXAMPLES * cls_train
    scratch_epochs = round(spent / (LABELLED_EXAMPLES * cls_train), 1)
    c.stages = (
        ("pretrain", pretrain),
        ("finetune", {"init.checkpoint": "{workdir}/pretrain"}),
        ("scratch", {"total_epochs": scratch_epochs, "checkpoint.every_epochs": 500.0}),
    )
    c.stage_results = (("ssl_finetune_top1", "finetune:eval/top1"), ("scratch_top1", "scratch:eval/top1"))
    return c
