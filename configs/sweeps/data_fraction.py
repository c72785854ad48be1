"""Data hunger in miniature (the ViT paper's §4.3, Figures 3 and 4): a small BiT ResNet and a small ViT trained on
5%, 10%, 30%, 50% and 100% of the embedded digits data: five sizes, the fewest points the report's scaling-law fit
of error against training-set size takes per model.

Every run trains for the same number of examples (15 epochs of the full training split, 169 steps of 128), so every
model spends the same compute whatever its data: each image of the 10% subset is seen ten times as often, as the
paper's subsets of JFT were trained with the same hyper-parameters. Subsets are nested (the 10% set is inside the 30%
set; vit_jax/data/indexing.py); 5% is 72 images, about 7 per class. The evaluation is the whole test split (360
images), once at the end.

    vit-jax sweep run configs/sweeps/data_fraction.py --root workdirs/data_fraction
    vit-jax sweep report workdirs/data_fraction        # data.png: test top-1 against training-set size

Result and timing: docs/sweeps.md.
"""

DIGITS_TRAIN = 1437  # images in the digits training split
EXAMPLES = 15 * DIGITS_TRAIN

# Same labels as configs/sweeps/demo_scaling.py: a ViT of 4 blocks of width 128 on 4x4 patches (the demo's model until 2026-12-02) and the BiT
# ResNet-v2 of two one-unit stages (ViT options back at their defaults).
MODELS = {
    "w128-d4": {"model.width": 128, "model.depth": 4, "model.mlp_dim": 256, "model.num_heads": 4},
    "BiT-R1-1x1": {"model.variant": "BiT-R1-1x1", "model.width": 0, "model.depth": 0, "model.mlp_dim": 0,
                   "model.num_heads": 0, "model.patch_size": 0, "model.pool": "token"},
}


def get_sweep():
    return {
        "description": "a small ViT and a small BiT ResNet on 5/10/30/50/100% of digits, same training compute",
        "base": "configs/demo.py",
        "fixed": {
            # Durations in examples, so that a fraction changes the data, not the schedule.
            "total_epochs": 0.0,
            "total_examples": EXAMPLES,
            "optimizer.warmup_epochs": 0.0,
            "optimizer.warmup_examples": 2 * DIGITS_TRAIN,  # the demo's 2 warm-up epochs of the full split
            "eval.every_epochs": 0.0,  # only at the end
            "checkpoint.every_epochs": 0.0,
            "eval.fewshot.datasets": (),
        },
        "grid": {"model": MODELS, "data.fraction": [0.05, 0.1, 0.3, 0.5, 1.0]},
    }
