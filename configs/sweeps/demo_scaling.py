"""Demo scaling study: the ViT paper's compute-versus-accuracy sweep shrunk onto the embedded digits data.

Three model sizes (from a 2-block width-32 ViT on 8x8 patches up to the demo model itself, width 96 on 4x4 patches)
times two training lengths: six runs of configs/demo.py that together finish in well under 15 minutes on 2 CPU
cores (the largest, 15 epochs of the demo model, takes about a minute; each run also pays ~30 s of start-up and
compilation).

    vit-jax sweep run configs/sweeps/demo_scaling.py --root workdirs/demo_scaling
    vit-jax sweep report workdirs/demo_scaling                  # or --metric fewshot/digits/5shot

`demo_scaling.py:3,10,30` trains for those numbers of epochs instead.
"""

# label -> model overrides (the trainer's model.* keys; configs/demo.py sets variant "", so these sizes are used).
MODELS = {
    "w32-d2-p8": {"model.width": 32, "model.depth": 2, "model.mlp_dim": 64, "model.num_heads": 2,
                  "model.patch_size": 8},
    "w64-d4-p8": {"model.width": 64, "model.depth": 4, "model.mlp_dim": 128, "model.num_heads": 2,
                  "model.patch_size": 8},
    "w96-d4-p4": {"model.width": 96, "model.depth": 4, "model.mlp_dim": 192, "model.num_heads": 3,
                  "model.patch_size": 4},
}


def get_sweep(epochs: str = "5,15"):
    return {
        "description": "model size x training length on digits (the paper's Fig. 5 / Table 6 study, in miniature)",
        "base": "configs/demo.py",
        "fixed": {
            # An evaluation every 2.5 epochs gives each run a training curve (the demo evaluates every 10).
            "eval.every_epochs": 2.5,
            "checkpoint.every_epochs": 5.0,
        },
        "grid": {
            "model": MODELS,
            "total_epochs": [float(e) if "." in e else int(e) for e in epochs.split(",")],
        },
    }
