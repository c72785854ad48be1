"""MAE pretraining (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners"), labels unused.

    python -m vit_jax.main --config=configs/vit_mae.py:variant=B/16 --workdir=...
    args: variant=B/16|L/16|H/14, epochs=800, batch=4096, dataset=imagenet2012|imagenet21k

The paper's recipe (its appendix A.1, Table 8): mask 75% of the patches per image, encoder on the rest, decoder 512
wide and 8 blocks deep (16 heads), loss on per-patch normalised pixels; AdamW beta1 0.9, beta2 0.95, weight decay
0.05, base lr 1.5e-4 scaled by batch/256 (2.4e-3 at batch 4096), cosine decay after 40 warmup epochs, 800 epochs
(1600 for its best numbers), random resized crops of 20-100% of the area and flips, class token, fixed 2-D sin-cos
position embeddings. Reported ImageNet-1k top-1 after fine-tuning (100 epochs for B, 50 for L/H): ViT-B/16 83.6%,
ViT-L/16 85.9%, ViT-H/14 86.9%; this config has not been run at that scale here (docs/ssl.md says what is tested).

Fine-tune from the run with configs/finetune.py (`init=WORKDIR,recipe=mae`): the encoder loads, the decoder is not
read, a new zero-initialised head is added, and the paper's fine-tuning recipe applies (layer-wise lr decay 0.65-0.75,
drop path, 100/50 epochs; docs/ssl.md).

Target topology (TARGETS below; compiled by the TPU compiler in benchmarks/preflight_configs.py, table in
docs/BENCHMARKS.md): the paper's 128 TPU v3 cores, v3-128 (v3:8x8), for B/16 and L/16.
"""

from vit_jax.train.config import default_config, parse_config_args

TARGETS = {"variant=B/16": "v3:8x8", "variant=L/16": "v3:8x8"}
WIDE = ("L/", "H/")  # scanned, rematerialised, FSDP-sharded (as configs/vit_i21k.py)
DATASETS = {"imagenet2012": ("imagenet2012", "validation"), "imagenet21k": ("imagenet21k/fall11", "test")}


def get_config(arg=None):
    a = parse_config_args(arg, {"variant": "B/16", "epochs": "800", "batch": "4096", "dataset": "imagenet2012"})
    if a["dataset"] not in DATASETS:
        raise ValueError(f"dataset={a['dataset']}: use {' or '.join(DATASETS)}")
    c = default_config()
    c.objective = "mae"
    c.mae.mask_ratio = 0.75
    c.mae.decoder_width, c.mae.decoder_depth, c.mae.decoder_heads, c.mae.decoder_mlp_dim = 512, 8, 16, 2048
    c.mae.norm_pix_loss = True
    c.model.variant = a["variant"]
    c.model.image_size = 224
    c.model.pool, c.model.posemb = "token", "sincos2d"
    c.model.dtype = "bfloat16"
    c.model.scan = a["variant"].startswith(WIDE)
    c.model.remat = "dots_no_batch" if c.model.scan else "none"
    c.mesh.fsdp = 8 if c.model.scan else 1
    c.data.name, c.data.eval_split = DATASETS[a["dataset"]]
    c.data.train_split = "train"
    c.data.pp_train = "decode_jpeg_and_inception_crop(224,20)|flip_lr|value_range(-1,1)"
    c.data.pp_eval = "decode|resize_small(256)|central_crop(224)|value_range(-1,1)"
    c.batch_size = int(a["batch"])
    c.total_epochs = float(a["epochs"])
    c.optimizer.name = "adamw"
    c.optimizer.b1, c.optimizer.b2 = 0.9, 0.95
    c.optimizer.lr = 1.5e-4 * c.batch_size / 256
    # The paper's weight decay 0.05 is PyTorch's AdamW convention (lr x wd), which optax's adamw also follows.
    c.optimizer.weight_decay = 0.05
    c.optimizer.grad_clip_norm = 0.0  # the paper does not clip
    c.optimizer.schedule = "cosine"
    c.optimizer.warmup_epochs = 40.0
    c.loss.label_smoothing = 0.0
    # Representation quality during pretraining: the reconstruction loss, and a few-shot linear probe on ImageNet-1k
    # features (labels used only by the probe).
    c.eval.evaluators = ("reconstruction", "fewshot")
    c.eval.every_epochs = 10.0
    c.eval.fewshot.datasets = ("imagenet2012",)
    c.eval.fewshot.shots = (5, 10, 25)
    c.eval.fewshot.every_epochs = 50.0
    c.eval.fewshot.max_train_examples = 50_000
    c.log_every_steps = 100
    c.checkpoint.every_steps = 2_000
    return c
