"""Masked patch prediction pretraining (the ViT paper's self-supervision, Dosovitskiy et al. 2021, §4.6 and appendix
B.1.2), labels unused.

    python -m vit_jax.main --config=configs/vit_mpp.py:variant=B/16 --workdir=...
    args: variant=B/16, steps=1000000, batch=4096, dataset=imagenet21k|imagenet2012, target=mean_color_3bit

The paper's recipe: corrupt 50% of each image's patch embeddings (80% of them replaced by a learnable [mask]
embedding, 10% by another random patch's embedding, 10% kept), predict the 3-bit mean colour (512 classes) of every
corrupted patch from its output token with softmax cross-entropy; ViT-B/16, 1M steps (about 14 epochs of JFT) at
batch 4096, Adam with lr 2e-4, 10k warmup steps and cosine decay. The appendix gives no weight decay for this run
(none here); the other settings (224 px, class token, learned position embeddings, Inception crops and flips,
global-norm clipping at 1) are the paper's supervised pretraining's (configs/vit_i21k.py). JFT is not public: the
paper reports similar gains when pretraining on ImageNet and diminishing returns after 100k steps, so the default
data here is ImageNet-21k. `target=color_4x4_3bit|pixels_l2` selects the paper's other two targets (it found all
three work, L2 slightly worse, and reports the mean colour).

Reported (§4.6): ViT-B/16 pretrained so, then fine-tuned, reaches 79.9% ImageNet top-1: 2% above training from
scratch and 4% below supervised pretraining. This config has not been run at that scale here (docs/ssl.md).

Fine-tune from the run with configs/finetune.py (`init=WORKDIR`): the encoder loads, the [mask] embedding and the
prediction head are not read, and a new zero-initialised head is added.

Target topology (TARGETS below; compiled by the TPU compiler in benchmarks/preflight_configs.py, whose table in
docs/BENCHMARKS.md does not have this config's row yet): B/16 on TPU v3-128 (v3:8x8), as the supervised B/16 of
configs/vit_i21k.py.
"""

from vit_jax.train.config import default_config, parse_config_args

DATASETS = {"imagenet21k": ("imagenet21k/fall11", "validation"), "imagenet2012": ("imagenet2012", "validation")}
TARGETS = {"variant=B/16": "v3:8x8"}


def get_config(arg=None):
    a = parse_config_args(arg, {"variant": "B/16", "steps": "1000000", "batch": "4096", "dataset": "imagenet21k",
                                "target": "mean_color_3bit"})
    if a["dataset"] not in DATASETS:
        raise ValueError(f"dataset={a['dataset']}: use {' or '.join(DATASETS)}")
    c = default_config()
    c.objective = "masked_patch_prediction"
    c.mpp.target = a["target"]
    c.mpp.corrupt_ratio, c.mpp.mask_prob, c.mpp.random_prob = 0.5, 0.8, 0.1
    c.model.variant = a["variant"]
    c.model.image_size = 224
    c.model.pool, c.model.posemb = "token", "learn"
    c.model.dtype = "bfloat16"
    c.data.name, c.data.eval_split = DATASETS[a["dataset"]]
    c.data.train_split = "train"
    c.data.pp_train = "decode_jpeg_and_inception_crop(224)|flip_lr|value_range(-1,1)"
    c.data.pp_eval = "decode|resize_small(256)|central_crop(224)|value_range(-1,1)"
    c.batch_size = int(a["batch"])
    c.total_steps = int(a["steps"])
    c.optimizer.name = "adamw"
    c.optimizer.lr = 2e-4
    c.optimizer.b1, c.optimizer.b2 = 0.9, 0.999
    c.optimizer.weight_decay = 0.0
    c.optimizer.grad_clip_norm = 1.0
    c.optimizer.schedule = "cosine"
    c.optimizer.warmup_steps = 10_000
    c.loss.label_smoothing = 0.0
    # Representation quality during pretraining: the masked-patch accuracy, and a few-shot linear probe on
    # ImageNet-1k features (the paper's few-shot metric picked its target; labels used only by the probe).
    c.eval.evaluators = ("masked_patch", "fewshot")
    c.eval.every_steps = 10_000
    c.eval.fewshot.datasets = ("imagenet2012",)
    c.eval.fewshot.shots = (5, 10, 25)
    c.eval.fewshot.every_steps = 50_000
    c.eval.fewshot.max_train_examples = 50_000
    c.log_every_steps = 100
    c.checkpoint.every_steps = 2_000
    c.checkpoint.keep_every_steps = 100_000
    return c
