"""ImageNet-21k pretraining as in the ViT paper (Dosovitskiy et al., 2021), Table 3 and §4.1.

    python -m vit_jax.main --config=configs/vit_i21k.py:variant=B/16 --workdir=gs://bucket/vit_b16_i21k
    args: variant=B/16|B/32|L/16|L/32|H/14|R50+B/16|BiT-R50x1|..., epochs=90 (B) / 30 or 90 (L), loss=sigmoid|softmax

Recipe (Table 3, ImageNet-21k rows): Adam (b1 0.9, b2 0.999), batch 4096, lr 1e-3, weight decay 0.03, dropout 0.1,
global-norm clipping at 1, 10k linear warmup steps then linear decay, 224 px, a pre-logits (representation) layer of
the model width with tanh in the pretraining head. Labels are multi-hot over the 21,843 classes of the official
checkpoints; `loss=sigmoid` (default) uses sigmoid cross-entropy with the head bias initialised to -10 as in AugReg
(Steiner et al., 2021), `loss=softmax` the softmax cross-entropy. Expected result: fine-tuned at 384 px on ImageNet,
B/16 reaches about 84% top-1 (paper Table 2: ViT-B/16 i21k 83.97%, ViT-L/16 i21k 85.15%).

Choose the model with the `variant` argument, not `--config.model.variant=...`: the pre-logits width, scan + remat,
FSDP and the first-moment dtype are derived from the argument when this file is read, before overrides apply.

Target topologies (TARGETS below; each variant's train and eval steps are compiled for its target by the TPU compiler
in benchmarks/preflight_configs.py, table in docs/BENCHMARKS.md): B/32, B/16 and R50+B/16 on TPU v3-128 (v3:8x8),
L/32 and L/16 on v3-256 (v3:8x16), H/14 on v3-512 (v3:16x16), g/14 on v3-1024 (v3:16x32).

A BiT ResNet variant (`variant=BiT-R152x2`) trains with the same recipe, as the ViT paper trained its ResNet baselines
(Adam, Appendix D.1; configs/sweeps/paper_scaling.py): it takes only the resolution and compute dtype from here (it
has no pre-logits layer, dropout or scan; its zero head's bias starts at -10 with `loss=sigmoid`, as a ViT's). BiT's own SGD recipe
is configs/bit_i21k.py.

Weight decay follows optax's decoupled convention (added to the update and scaled by the learning-rate schedule).
"""

from vit_jax.models import parse_variant
from vit_jax.models.bit_config import is_bit_name
from vit_jax.train.config import default_config, parse_config_args

WIDE = ("L/", "H/", "g/", "G/")  # scanned, rematerialised, FSDP-sharded
HUGE = ("H/", "g/", "G/")  # also a bfloat16 first moment
TARGETS = {"variant=B/32": "v3:8x8", "variant=B/16": "v3:8x8", "variant=R50+B/16": "v3:8x8",
           "variant=L/32": "v3:8x16", "variant=L/16": "v3:8x16", "variant=H/14": "v3:16x16",
           "variant=g/14": "v3:16x32"}


def get_config(arg=None):
    a = parse_config_args(arg, {"variant": "B/16", "epochs": "90", "loss": "sigmoid"})
    c = default_config()
    v = a["variant"]
    c.model.variant = v
    c.model.image_size = 224
    c.model.dtype = "bfloat16"
    bit = is_bit_name(v)
    if not bit:
        _vit_model(c, v)
    c.data.name = "imagenet21k/fall11"
    c.data.train_split, c.data.eval_split = "train", "validation"
    c.data.pp_train = "decode_jpeg_and_inception_crop(224)|flip_lr|value_range(-1,1)"
    c.data.pp_eval = "decode|resize_small(256)|central_crop(224)|value_range(-1,1)"
    c.batch_size = 4096
    c.total_epochs = float(a["epochs"])
    c.optimizer.name = "adamw"
    c.optimizer.lr = 1e-3
    c.optimizer.b1, c.optimizer.b2 = 0.9, 0.999
    c.optimizer.weight_decay = 0.03
    c.optimizer.grad_clip_norm = 1.0
    c.optimizer.warmup_steps = 10_000
    c.optimizer.schedule = "linear"
    c.optimizer.mu_dtype = "bfloat16" if v.split("+")[-1].startswith(HUGE) else "float32"
    if a["loss"] == "sigmoid":
        c.loss.kind = "sigmoid_xent"
        c.model.head_bias_init = -10.0  # ViT and BiT alike: the zero head starts every class at p = 4.5e-5
    elif a["loss"] == "softmax":
        c.loss.kind = "softmax_xent"
    else:
        raise ValueError(f"loss={a['loss']}: use sigmoid or softmax")
    c.mesh.fsdp = 8 if c.model.scan else 1  # shard parameters and optimizer state of L/H over 8 devices
    c.log_every_steps = 100
    c.eval.every_steps = 10_000
    c.checkpoint.every_steps = 2_000
    c.checkpoint.keep = 3
    c.checkpoint.keep_every_steps = 50_000
    return c


def _vit_model(c, v: str) -> None:
    """The ViT (and hybrid) settings of the recipe: pre-logits layer, dropout, scan + remat for the deep ones."""
    c.model.pool = "token"
    c.model.dropout = 0.1
    # Deep models: one compiled block scanned over depth, and rematerialised activations.
    c.model.scan = any(v.split("+")[-1].startswith(w) for w in WIDE)  # R50+L/16: the ViT part decides
    c.model.remat = "dots_no_batch" if c.model.scan else "none"
    c.model.rep_size = parse_variant(v)["width"]  # the paper's pretraining head
