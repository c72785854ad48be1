"""The ViT paper's scaling study (Sec. 4.4, Fig. 5, Table 6): ViT, BiT ResNet and hybrid sizes at 7 and 14 epochs.

This is the pod-scale sweep: each run pretrains on ImageNet-21k (configs/vit_i21k.py) with few-shot evaluation on
transfer sets, which takes TPU-pod days per model (ViT-H/14 for 14 epochs is the largest). Run it with the TPU
launcher from a machine that can reach the pod and the bucket (see docs/sweeps.md):

    vit-jax sweep run configs/sweeps/paper_scaling.py --root gs://BUCKET/sweeps/paper_scaling \
        --launcher=tpu --launcher-arg=--name=POD_NAME --launcher-arg=--zone=ZONE
    vit-jax sweep report gs://BUCKET/sweeps/paper_scaling --metric fewshot/imagenet2012/10shot --compare-paper

Fine-tuned accuracy (Table 6's metric): fine-tune every finished run with
`configs/sweeps/finetune_lr.py:imagenet2012,gs://BUCKET/sweeps/paper_scaling` into another root, then add
`--finetune-root THAT_ROOT --metric finetune/imagenet2012/top1` to the report (docs/sweeps.md).

The paper trained on JFT-300M; its Table 6 points are what `--compare-paper` overlays. It ran every model at
7 epochs and the largest ones also at 14; this grid runs every model at both lengths (use `--only '*total_epochs=7'`
for the first half). The recipe is the paper's Table 3 JFT-300M rows, which belong to this 7/14-epoch study: the
learning rate per model, weight decay 0.1 and no dropout (the i21k rows' 0.03 / 0.1 are for 90-epoch runs); batch
4096, Adam, 10k warm-up steps, linear decay and 224 px come from the base config. Each model is chosen with the base
config's `variant` argument (`config_args`), so what vit_i21k.py derives from it (pre-logits width, scan + remat and
FSDP for L/H, bf16 first moment for H) is that model's own.

The ResNets are Table 6's BiT ResNet-v2 rows (R50x1, R50x2, R101x1, R152x1, R152x2, R200x3), trained with the same
recipe as the paper did (Adam: its Appendix D.1 found Adam better than SGD for them on JFT; the learning rates are
Table 3's ResNet rows; Table 3 has no R200x3 row, which gets its nearest neighbour R152x2's 6e-4). BiT's own SGD
recipe is configs/bit_i21k.py.
"""

# label -> overrides; learning rates from the paper's Table 3 (bigger models need smaller ones).
MODELS = {
    "ViT-B-32": {"config_args": "variant=B/32", "optimizer.lr": 8e-4},
    "ViT-B-16": {"config_args": "variant=B/16", "optimizer.lr": 8e-4},
    "ViT-L-32": {"config_args": "variant=L/32", "optimizer.lr": 6e-4},
    "ViT-L-16": {"config_args": "variant=L/16", "optimizer.lr": 4e-4},
    "ViT-H-14": {"config_args": "variant=H/14", "optimizer.lr": 3e-4},
    "BiT-R50x1": {"config_args": "variant=BiT-R50x1", "optimizer.lr": 1e-3},
    "BiT-R50x2": {"config_args": "variant=BiT-R50x2", "optimizer.lr": 1e-3},
    "BiT-R101x1": {"config_args": "variant=BiT-R101x1", "optimizer.lr": 8e-4},
    "BiT-R152x1": {"config_args": "variant=BiT-R152x1", "optimizer.lr": 6e-4},
    "BiT-R152x2": {"config_args": "variant=BiT-R152x2", "optimizer.lr": 6e-4},
    "BiT-R200x3": {"config_args": "variant=BiT-R200x3", "optimizer.lr": 6e-4},
    "R50+ViT-B-32": {"config_args": "variant=R50+B/32", "optimizer.lr": 8e-4},
    "R50+ViT-B-16": {"config_args": "variant=R50+B/16", "optimizer.lr": 8e-4},
    "R50+ViT-L-32": {"config_args": "variant=R50+L/32", "optimizer.lr": 2e-4},
    "R50+ViT-L-16": {"config_args": "variant=R50+L/16", "optimizer.lr": 4e-4},
}

# Few-shot linear probes on frozen features during and after pretraining (the paper's Fig. 5 right uses 5-shot
# ImageNet; Table 6 reports fine-tuned accuracy: configs/sweeps/finetune_lr.py over this sweep root, see above).
TRANSFER_SETS = ("imagenet2012", "cifar100", "oxford_iiit_pet")


def get_sweep():
    return {
        "description": "ViT paper Sec. 4.4: ViT, BiT ResNet and R50+ViT sizes x {7, 14} epochs of ImageNet-21k "
                       "pretraining",
        "base": "configs/vit_i21k.py",
        "fixed": {
            # Durations are in epochs here: clear the alternatives in case the base config uses them.
            "total_steps": 0,
            "total_examples": 0,
            # Table 3, JFT-300M rows.
            "optimizer.weight_decay": 0.1,
            "model.dropout": 0.0,
            "eval.fewshot.datasets": TRANSFER_SETS,
            "eval.fewshot.shots": (1, 5, 10, 25),
            # Shots are drawn from the first 50k training images of each set (TFDS stores splits shuffled): ~50 per
            # ImageNet class, enough for 25 shots, without embedding all 1.28M images at every evaluation.
            "eval.fewshot.max_train_examples": 50_000,
        },
        "runs": MODELS,
        "grid": {"total_epochs": [7, 14]},
    }
