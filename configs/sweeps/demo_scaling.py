"""Demo scaling study: the ViT paper's compute-versus-accuracy sweep shrunk onto the embedded digits data.

Three model sizes (from a 2-block width-32 ViT up to the demo model itself, 4 blocks of width 128; all on 4x4
patches of the demo's 16x16 images) times two training lengths: six runs of configs/demo.py that together finish
in well under 15 minutes on 2 CPU cores (most of each run is start-up, compilation and evaluation).

    vit-jax sweep run configs/sweeps/demo_scaling.py --root workdirs/demo_scaling
    vit-jax sweep report workdirs/demo_scaling                  # or --metric fewshot/digits/5shot

`demo_scaling.py:3,10,30` trains for those numbers of epochs instead.
"""

# label -> model overrides (the trainer's model.* keys; configs/demo.py sets variant "", so these sizes are used).
MODELS = {
    "w32-d2": {"model.width": 32, "model.depth": 2, "model.mlp_dim": 64, "model.num_heads": 2},
    "w64-d4": {"model.width": 64, "model.depth": 4, "model.mlp_dim": 128, "model.num_heads": 2},
    "w128-d4": {"model.width": 128, "model.depth": 4, "model.mlp_dim": 256, "model.num_heads": 4},  # the demo model
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
