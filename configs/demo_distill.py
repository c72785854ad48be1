"""Distillation demo: a ViT teacher trained on the embedded digits, distilled into a smaller ViT student on 5% of
the training images, against the same student trained on those images' labels alone with the same compute. One
command, three stages (vit_jax/train/stages.py):

    python -m vit_jax.main --config=configs/demo_distill.py --workdir=workdirs/demo_distill
    args: seed=0

1. `teacher`: configs/demo.py's ViT (width 64, 4 blocks) on all 1,437 labelled training images.
2. `distilled`: the student (the teacher's width, 2 blocks: half its depth and forward FLOPs) trained on train[:5%]
   (72 images) by function matching (Beyer et al. 2022): the KL to the frozen teacher at temperature 1, teacher and
   student seeing the identical mixup'd / CutMix'd, cropped batch; no label loss (distill.alpha = 1).
3. `labels_only`: the same student and recipe with the labels of the same 72 images as its only target
   (objective `classification`, the same mixup/CutMix), for as many epochs as make its training FLOPs equal to the
   distilled stage's (whose FLOPs count the teacher's forward: models/flops.py Flops.frozen_forward).

The full digits leave no room for a 2-point gap (the demo's ViT reaches 97.8-98.9% on its own labels), hence the
5%: with 10% (144 images) the label-only student reached 93.6-95.8% and the teachers 97.8-98.6%, too little room
for a 2-point gap at every seed (docs/distillation.md has the figures). Both students' training images and test
images (360) are the same; only the target differs. The teacher's own training is not counted in the students'
compute: it stands for a model one already has.

WORKDIR/summary.json holds `distilled_top1`, `labels_only_top1` and `teacher_top1` (test accuracy). Measured
numbers, time and seeds: docs/distillation.md; benchmarks/demo_distill.sh checks them at 3 seeds.
"""

from pathlib import Path

from vit_jax.models.build import model_flops
from vit_jax.train.config import config_module, model_config, parse_config_args

# digits' split sizes (vit_jax/data/digits.py; tests/train/test_demo_distill_config.py checks them against the data)
TRAIN_EXAMPLES, LABELLED_EXAMPLES, NUM_CLASSES = 1437, 72, 10
TEACHER_EPOCHS, STUDENT_EPOCHS = 100.0, 600.0
TEACHER = {"model.width": 64, "model.depth": 4, "model.mlp_dim": 128, "model.num_heads": 4}
STUDENT = {"model.width": 64, "model.depth": 2, "model.mlp_dim": 128, "model.num_heads": 4}


def get_config(arg=None):
    a = parse_config_args(arg, {"seed": "0"})
    # The demo's data, preprocessing and optimizer (configs/demo.py: AdamW, wd 0.05, cosine, clip 1).
    c = config_module(Path(__file__).with_name("demo.py")).get_config()
    c.seed = int(a["seed"])
    for key, value in STUDENT.items():
        setattr(c.model, key.partition(".")[2], value)
    c.data.train_split = "train[:5%]"
    # The students' recipe: small batches for 72 images; mixup/CutMix as function matching pairs it with (each
    # step shows the teacher a new mixture, so 72 images give many more distinct targets than 72 labels).
    c.batch_size = 32
    c.total_epochs = STUDENT_EPOCHS
    c.optimizer.lr = 2e-3
    c.optimizer.warmup_epochs = 5.0
    c.loss.label_smoothing = 0.0
    c.loss.mixup_alpha, c.loss.cutmix_alpha, c.loss.cutmix_switch_prob = 0.5, 1.0, 0.5
    c.log_every_steps = 200
    c.eval.every_epochs = 0.0  # evaluated once, at the end of each stage
    c.checkpoint.every_epochs = 100.0
    c.eval.fewshot.datasets, c.eval.fewshot.every_epochs = (), 0.0  # no few-shot probe in this demo
    c.eval.evaluators = ("classification",)

    teacher = {
        **TEACHER, "data.train_split": "train", "batch_size": 128, "total_epochs": TEACHER_EPOCHS,
        "optimizer.lr": 2e-3, "optimizer.warmup_epochs": 2.0, "loss.label_smoothing": 0.1,
        "loss.mixup_alpha": 0.0, "loss.cutmix_alpha": 0.0, "checkpoint.every_epochs": 50.0,
    }
    distilled = {
        "objective": "distillation", "distill.teacher": "{workdir}/teacher", "distill.mode": "function_matching",
        "distill.temperature": 1.0, "distill.alpha": 1.0, "eval.evaluators": ("distillation",),
    }
    # Equal compute: per image the distilled student spends its own forward and backward (3x its forward) and the
    # teacher's forward; the label-only student spends 3x its forward, so it trains for proportionally more epochs.
    teacher_fwd = model_flops(model_config(_with(c, TEACHER), NUM_CLASSES)).forward
    student = model_flops(model_config(c, NUM_CLASSES))
    labels_epochs = round(STUDENT_EPOCHS * (student.train + teacher_fwd) / student.train, 1)
    c.stages = (
        ("teacher", teacher),
        ("distilled", distilled),
        ("labels_only", {"total_epochs": labels_epochs, "checkpoint.every_epochs": 500.0}),
    )
    c.stage_results = (("distilled_top1", "distilled:eval/top1"), ("labels_only_top1", "labels_only:eval/top1"),
                       ("teacher_top1", "teacher:eval/top1"))
    return c


def _with(c, overrides: dict):
    """A copy of the config with dotted `model.*` overrides applied (the teacher's architecture, for its FLOPs)."""
    out = c.copy_and_resolve_references()
    for key, value in overrides.items():
        setattr(out.model, key.partition(".")[2], value)
    return out
