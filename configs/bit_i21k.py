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

Target topology (TARGETS below; compiled by the TPU compiler in benchmarks/preflight_configs.py, table in
docs/BENCHMARKS.md): R50x1 on TPU v3-128 (v3:8x8), as the ViT configs of the same batch.

The ViT paper's own ResNet baselines (Table 6) were trained with Adam instead (its Appendix D.1):
configs/vit_i21k.py:variant=BiT-R50x1, which configs/sweeps/paper_scaling.py uses.
"""

from pathlib import Path

from vit_jax.models.bit_config import is_bit_name
from vit_jax.train.config import ConfigError, config_module, parse_config_args

TARGETS = {"variant=BiT-R50x1": "v3:8x8"}


def _vit_i21k():
    """configs/vit_i21k.py, whose data, evaluation and checkpointing this recipe shares (config files are not a
    package: loaded by path)."""
    return config_module(Path(__file__).with_name("vit_i21k.py"))


def get_config(arg=None):
    a = parse_config_args(arg, {"variant": "BiT-R50x1", "epochs": "90"})
    if not is_bit_name(a["variant"]):
        raise ConfigError(f"variant={a['variant']} is not a BiT ResNet (e.g. BiT-R50x1, BiT-R152x2): ViTs train with "
                         "configs/vit_i21k.py")
    # ImageNet-21k at 224 px, batch 4096, sigmoid cross-entropy on the multi-hot labels, bf16 compute.
    c = _vit_i21k().get_config(f"variant={a['variant']},epochs={a['epochs']}")
    o = c.optimizer
    o.name, o.momentum = "sgd", 0.9
    o.lr = 0.03 * c.batch_size / 256
    o.weight_decay = 1e-3  # BiT's coupled 1e-4 under momentum 0.9 (see above)
    o.grad_clip_norm = 0.0
    o.warmup_steps = 5_000
    o.schedule = "staircase"
    o.staircase_at = tuple(e / 90 for e in (30, 60, 80))  # of a 90-epoch run; scaled with `epochs`
    o.staircase_factor = 0.1
    return c
