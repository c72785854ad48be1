"""DINOv2 (Oquab et al. 2023): label-free pretraining of ViT-S/B/L/g with patch 14 by the `dino` objective (DINO +
iBOT + KoLeo, an EMA teacher, multi-crop), on ImageNet-1k or ImageNet-21k.

    python -m vit_jax.main --config=configs/dinov2.py:variant=L --workdir=...
    python -m vit_jax.main --config=configs/dinov2.py:variant=g,data=i21k,registers=4 --workdir=...
    args: variant=S|B|L|g, data=i1k|i21k, registers=0|4 (Darcet et al. 2024), batch=N, epochs=N

Values are those of facebookresearch/dinov2's configs (read at the ANCHORS.md commit): `ssl_default_config.yaml`
for S/B/L (its `vitl16_short.yaml` trains on ImageNet-1k with exactly those defaults) and `train/vitg14.yaml` for g
(on ImageNet-22k); the architecture is the released models' (`models/vision_transformer.py`, timm's
`vit_*_patch14_dinov2`; `vit_giant2` is width 1536, depth 40, 24 heads, SwiGLU of hidden 4096):

| setting | S/B/L (ssl_default_config) | g (vitg14.yaml) |
| --- | --- | --- |
| batch | 1024 (OFFICIAL_EPOCH_LENGTH 1250 x 1024 = one ImageNet-1k epoch) | 3072 (see below) |
| lr | base_lr 4e-3 x sqrt(batch / 1024) (scaling_rule sqrt_wrt_1024) | base_lr 2e-4, same rule |
| epochs, warmup | 100, 10 | 500, 80 |
| weight decay | 0.04 (-> 0.4 cosine there) | 0.04 (-> 0.2 there) |
| layer-wise lr decay | 0.9 | 1.0 (off) |
| drop path | 0.3 | 0.4 |
| teacher momentum | 0.992 -> 1 cosine | 0.994 -> 1 |
| head | 65,536 prototypes, bottleneck 256, shared iBOT head | 131,072, bottleneck 384, separate iBOT head |
| centring | centring | Sinkhorn-Knopp |
| local crops | 8 x 96 px (with patch 16; 98 here, see below) | 8 x 98 px |

Shared: AdamW (0.9, 0.999), clip 3.0, min lr 1e-6, LayerScale 1e-5, qkv bias, teacher temperature 0.04 -> 0.07 over
30 epochs, prototypes frozen for the first epoch, global crops 224 px at scale 0.32-1, local 0.05-0.32, iBOT on half
the global crops with mask ratios 0.1-0.5, loss weights DINO 1, iBOT 1, KoLeo 0.1, position-embedding interpolation
with offset 0.1 (`interpolate_offset`, model.posemb_resize='dinov2'). ssl_default_config's patch is 16; the released
models, and these configs, use 14, so every size takes vitg14.yaml's 98 px local crops (7 x 7 patches; 96 px is not
a whole number of 14 px patches, which the objective refuses).

Where this differs from the reference, because the trainer has no such knob (yet): weight decay stays at its start
value 0.04 (DINOv2 raises it by a cosine to 0.4 / 0.2); no layer-wise lr decay (the trainer allows
`optimizer.layer_decay` for fine-tuning only; DINOv2 pretrains S/B/L with 0.9); drop path grows linearly over depth (DINOv2:
`drop_path_uniform`); the patch embedding learns at the full lr (DINOv2: x0.2). vitg14.yaml fixes only the batch per
GPU (12); 3072 is the issue's figure for g (12 per GPU on 256 GPUs), not read from the paper here: pass batch=N.
The multi-crop is cut on the devices from each example's image, which the input pipeline resizes to 256 px (shorter
side, then a central square).
"""

import math

from vit_jax.errors import ConfigError
from vit_jax.train.config import default_config, parse_config_args

# width, depth, heads, MLP (SwiGLU: each half's hidden size), ffn
SIZES = {"S": (384, 12, 6, 1536, "mlp"), "B": (768, 12, 12, 3072, "mlp"), "L": (1024, 24, 16, 4096, "mlp"),
         "g": (1536, 40, 24, 4096, "swiglu")}
DATA = {"i1k": ("imagenet2012", "validation"), "i21k": ("imagenet21k/fall11", "validation")}
DEFAULT = dict(lr=4e-3, epochs=100, warmup=10, drop_path=0.3, momentum=0.992, prototypes=65_536,
               bottleneck=256, separate_ibot_head=False, centering="centering", local_size=98, batch=1024)
GIANT = dict(lr=2e-4, epochs=500, warmup=80, drop_path=0.4, momentum=0.994, prototypes=131_072,
             bottleneck=384, separate_ibot_head=True, centering="sinkhorn_knopp", local_size=98, batch=3072)


def get_config(arg=None):
    a = parse_config_args(arg, {"variant": "L", "data": "i1k", "registers": "0", "batch": "0", "epochs": "0"})
    if a["variant"] not in SIZES:
        raise ConfigError(f"variant={a['variant']}: DINOv2 comes as {', '.join(SIZES)}")
    if a["data"] not in DATA:
        raise ConfigError(f"data={a['data']}: use one of {', '.join(DATA)}")
    r = GIANT if a["variant"] == "g" else DEFAULT
    width, depth, heads, mlp, ffn = SIZES[a["variant"]]
    c = default_config()
    m = c.model
    m.variant = ""  # sizes below (ViT-g here is DINOv2's giant2, not the Scaling ViT g of models/config.py)
    m.width, m.depth, m.num_heads, m.mlp_dim, m.ffn = width, depth, heads, mlp, ffn
    m.patch_size, m.image_size, m.pool, m.posemb = 14, 224, "token", "learn"
    m.gelu = "erf"  # nn.GELU, as DINOv2 and timm
    m.layer_scale, m.registers, m.posemb_resize = 1e-5, int(a["registers"]), "dinov2"
    m.drop_path = r["drop_path"]
    m.dtype = "bfloat16"
    c.objective = "dino"
    c.dino.update(prototypes=r["prototypes"], head_bottleneck=r["bottleneck"], separate_ibot_head=r["separate_ibot_head"],
                  centering=r["centering"], momentum_start=r["momentum"], local_crop_size=r["local_size"],
                  local_crops=8, teacher_temp_start=0.04, teacher_temp=0.07, teacher_temp_warmup=30 / r["epochs"],
                  freeze_prototypes=1 / r["epochs"], dino_weight=1.0, ibot_weight=1.0, koleo_weight=0.1)
    name, eval_split = DATA[a["data"]]
    c.data.name, c.data.train_split, c.data.eval_split = name, "train", eval_split
    c.data.pp_train = "decode|resize_small(256)|central_crop(256)|value_range(-1,1)"  # crops: the objective's
    c.data.pp_eval = "decode|resize_small(256)|central_crop(224)|value_range(-1,1)"
    c.batch_size = int(a["batch"]) or r["batch"]
    c.total_epochs = float(a["epochs"]) or float(r["epochs"])
    o = c.optimizer
    o.name, o.b1, o.b2 = "adamw", 0.9, 0.999
    o.lr = r["lr"] * math.sqrt(c.batch_size / 1024)  # scaling_rule: sqrt_wrt_1024
    o.end_lr_factor = 1e-6 / o.lr  # min_lr
    o.weight_decay, o.grad_clip_norm = 0.04, 3.0  # layer_decay: refused for pretraining (see the docstring)
    o.schedule, o.warmup_epochs = "cosine", float(r["warmup"]) * c.total_epochs / r["epochs"]
    c.eval.evaluators = ("dino",)
    c.log_every_steps = 100
    c.checkpoint.every_steps = 2_000
    return c
