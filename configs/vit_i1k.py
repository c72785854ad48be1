"""ImageNet-1k from scratch: the ViT paper's recipe, or the stronger plain-ViT baseline of Beyer et al. (2022).

    python -m vit_jax.main --config=configs/vit_i1k.py:variant=S/16,preset=beyer2022 --workdir=...
    args: variant=S/16|B/16|..., preset=paper|beyer2022, epochs=...

- preset=paper (Dosovitskiy et al. 2021, Table 3, ImageNet rows): Adam, batch 4096, 300 epochs, lr 3e-3, weight
  decay 0.3, dropout 0.1, 10k warmup, cosine decay, class token, learned posemb, pre-logits layer. Expected ViT-B/16:
  about 78% top-1 at 224 px (paper Table 5: 77.9% after fine-tuning at 384 px).
- preset=beyer2022 ("Better plain ViT baselines for ImageNet-1k"): S/16, batch 1024, 90 epochs, global average
  pooling, fixed 2D sin-cos position embeddings, RandAugment(2, 10), mixup 0.2, Inception crop, Adam lr 1e-3,
  decoupled weight decay 1e-4 in big_vision's convention (= 0.1 in optax's, which multiplies it by the lr), 10k
  warmup, cosine decay, no dropout, a pre-logits layer of the model width, bf16 first moment (as big_vision's
  configs/vit_s16_i1k.py). Reported: 76.5% top-1 after 90 epochs.

Target topologies (TARGETS below; compiled by the TPU compiler in benchmarks/preflight_configs.py, table in
docs/BENCHMARKS.md): beyer2022 S/16 on TPU v3-8 (v3:2x2), paper B/16 on v3-128 (v3:8x8).
"""

from vit_jax.train.config import default_config, parse_config_args

TARGETS = {"variant=S/16,preset=beyer2022": "v3:2x2", "variant=B/16,preset=paper": "v3:8x8"}


def get_config(arg=None):
    a = parse_config_args(arg, {"variant": "S/16", "preset": "beyer2022", "epochs": ""})
    c = default_config()
    c.model.variant = a["variant"]
    c.model.image_size = 224
    c.model.dtype = "bfloat16"
    c.data.name = "imagenet2012"
    c.data.train_split, c.data.eval_split = "train", "validation"
    c.data.pp_eval = "decode|resize_small(256)|central_crop(224)|value_range(-1,1)"
    c.optimizer.name = "adamw"
    c.optimizer.grad_clip_norm = 1.0
    c.optimizer.warmup_steps = 10_000
    c.optimizer.schedule = "cosine"
    if a["preset"] == "paper":
        c.model.pool, c.model.posemb, c.model.dropout = "token", "learn", 0.1
        from vit_jax.models import parse_variant

        c.model.rep_size = parse_variant(a["variant"])["width"]
        c.data.pp_train = "decode_jpeg_and_inception_crop(224)|flip_lr|value_range(-1,1)"
        c.batch_size = 4096
        c.total_epochs = float(a["epochs"] or 300)
        c.optimizer.lr, c.optimizer.weight_decay = 3e-3, 0.3
    elif a["preset"] == "beyer2022":
        c.model.pool, c.model.posemb = "gap", "sincos2d"
        from vit_jax.models import parse_variant

        # big_vision's vit_s16_i1k.py: rep_size=True (a pre-logits layer of the model width), bf16 first moment.
        c.model.rep_size = parse_variant(a["variant"])["width"]
        c.optimizer.mu_dtype = "bfloat16"
        c.data.pp_train = "decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2,10)|value_range(-1,1)"
        c.loss.mixup_alpha = 0.2
        c.batch_size = 1024
        c.total_epochs = float(a["epochs"] or 90)
        c.optimizer.lr, c.optimizer.weight_decay = 1e-3, 0.1
    else:
        raise ValueError(f"preset={a['preset']}: use paper or beyer2022")
    c.log_every_steps = 100
    c.eval.every_epochs = 5.0
    c.checkpoint.every_steps = 2_000
    return c
