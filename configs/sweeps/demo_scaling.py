"""Demo scaling study: the ViT paper's compute-versus-accuracy sweep shrunk onto the embedded digits data.

The paper's three families (§4.4, Figure 5), each small: three ViT sizes (from a 2-block width-32 ViT up to the
4 blocks of width 128 of the demo's model until 2026-12-02; all on 4x4 patches of the demo's 16x16 images) at two training lengths, and a
BiT ResNet-v2 of two one-unit stages (BiT-R1-1x1) and a hybrid (a one-unit BiT stem, /4, under a 2-block width-64
ViT on its 4x4 feature map) at the shorter one, and configs/demo_swin.py's Swin (not in the paper) at the shorter one
too: nine runs of configs/demo.py, all with the demo's recipe (Adam, as the paper trained its ResNets); the eight
without the Swin finish in well under 15 minutes on 2 CPU cores (most of each run is start-up, compilation and
evaluation; the Swin's run took 114 s on a machine shared with other jobs, where the others took 66-192 s:
docs/models.md). The ResNet and the hybrid run one length only, to keep the sweep within a
third more time than the ViT-only one (at 15 epochs, measured once: BiT 98.9% test top-1 against 98.3% at 5, the
hybrid 96.7% against 89.2%).

    vit-jax sweep run configs/sweeps/demo_scaling.py --root workdirs/demo_scaling
    vit-jax sweep report workdirs/demo_scaling                  # or --metric fewshot/digits/5shot

`demo_scaling.py:3,10,30` trains for those numbers of epochs instead (the ResNet and the hybrid for the first).
"""

# label -> model overrides (the trainer's model.* keys; configs/demo.py sets variant "", so these sizes are used).
MODELS = {
    "w32-d2": {"model.width": 32, "model.depth": 2, "model.mlp_dim": 64, "model.num_heads": 2},
    "w64-d4": {"model.width": 64, "model.depth": 4, "model.mlp_dim": 128, "model.num_heads": 2},
    "w128-d4": {"model.width": 128, "model.depth": 4, "model.mlp_dim": 256, "model.num_heads": 4},  # the demo's model until 2026-12-02
}
# The other families, at the shortest training length only.
OTHER_FAMILIES = {
    # A BiT ResNet has none of the ViT's options: the demo's sizes, patch and pooling go back to their defaults.
    "BiT-R1-1x1": {"model.variant": "BiT-R1-1x1", "model.width": 0, "model.depth": 0, "model.mlp_dim": 0,
                   "model.num_heads": 0, "model.patch_size": 0, "model.pool": "token"},
    "R1+w64-d2": {"model.width": 64, "model.depth": 2, "model.mlp_dim": 128, "model.num_heads": 2,
                  "model.resnet_layers": (1,), "model.resnet_width": 1, "model.patch_size": 1},
    # configs/demo_swin.py's Swin (2x2 patches, 4x4 windows, two stages): the hierarchical family beside the three.
    "Swin-32-2-2": {"model.variant": "Swin-32-2-2", "model.width": 0, "model.depth": 0, "model.mlp_dim": 0,
                    "model.num_heads": 0, "model.patch_size": 2, "model.window_size": 4, "model.pool": "token"},
}


def get_sweep(epochs: str = "5,15"):
    lengths = [float(e) if "." in e else int(e) for e in epochs.split(",")]
    # Labelled runs named as a model x total_epochs grid would name them ("model=w32-d2,total_epochs=5").
    runs = {f"model={label},total_epochs={e}": {**overrides, "total_epochs": e}
            for label, overrides in MODELS.items() for e in lengths}
    # One run each: ten evaluations over it (not two) give the report's scaling-law fit of each family the five or
    # more points of its front that it needs (a late evaluation can tie or beat the last); an evaluation of the 360
    # test images costs about a second.
    runs.update({f"model={label},total_epochs={lengths[0]}": {**overrides, "total_epochs": lengths[0],
                                                             "eval.every_epochs": lengths[0] / 10}
                 for label, overrides in OTHER_FAMILIES.items()})
    return {
        "description": "ViT sizes x training length, a BiT ResNet and a hybrid, on digits (the paper's Fig. 5 / "
                       "Table 6 study, in miniature)",
        "base": "configs/demo.py",
        "fixed": {
            # An evaluation every 2.5 epochs gives each run a training curve (the demo evaluates every 10).
            "eval.every_epochs": 2.5,
            "checkpoint.every_epochs": 5.0,
        },
        "runs": runs,
    }
