"""Function-matching distillation (Beyer et al. 2022, "Knowledge distillation: a good teacher is patient and
consistent"): a big BiT or ViT teacher into a smaller ViT on ImageNet-1k, big_vision's recipe
(big_vision/configs/proj/distill/bit_i1k.py).

    python -m vit_jax.main --config=configs/distill.py:teacher=/ckpt/BiT-M-R152x2-ilsvrc2012.npz --workdir=...
    args: teacher=CHECKPOINT (required), teacher_size=224, student=S/16, epochs=1200

What is big_vision's: the teacher sees exactly the student's batch (consistent: the same Inception crop, flip and
mixup); mixup on every batch with lambda ~ Beta(1, 1) (its mixup(p=1.0, n=2): a Dirichlet(1, 1)); the loss is the
KL to the teacher at temperature 1 with no label term (function matching, distill.alpha = 1); batch 4096; 1,200
epochs ("a good middle-ground"; the paper's best runs go to 9,600: patience); train[:98%], the last 2% a minival;
gradient clipping at 1.0; Adam with a bf16 first moment; 5,000 warmup steps then cosine decay. Its teacher is
BiT-M R152x2 fine-tuned on ImageNet at 224 px (83.0% top-1; its student BiT-R50x1 reaches 82.8% after 9,600
epochs at 224 px). Any checkpoint vit_jax reads can teach: a BiT .npz (give teacher_size: the file does not record
its resolution), an official ViT/AugReg .npz, a timm .safetensors, one of our runs.

What is not: big_vision's student is a ResNet (lr 0.03, weight decay 3e-4 in its convention). A ViT student takes
the plain-ViT optimizer of Beyer et al. 2022b ("Better plain ViT baselines", configs/vit_i1k.py preset beyer2022):
lr 1e-3, decoupled weight decay 1e-4 in big_vision's convention (0.1 in optax's), global average pooling, sin-cos
position embeddings, a pre-logits layer. The teacher must predict the same 1,000 classes.
"""

from vit_jax.train.config import default_config, parse_config_args


def get_config(arg=None):
    a = parse_config_args(arg, {"teacher": "", "teacher_size": "224", "student": "S/16", "epochs": "1200"})
    c = default_config()
    c.model.variant = a["student"]
    c.model.image_size = 224
    c.model.dtype = "bfloat16"
    c.model.pool, c.model.posemb = "gap", "sincos2d"
    from vit_jax.models import parse_variant

    c.model.rep_size = parse_variant(a["student"])["width"]
    c.data.name = "imagenet2012"
    c.data.train_split, c.data.eval_split = "train[:98%]", "validation"
    c.data.pp_train = "decode_jpeg_and_inception_crop(224)|flip_lr|value_range(-1,1)"
    c.data.pp_eval = "decode|resize_small(256)|central_crop(224)|value_range(-1,1)"
    c.batch_size = 4096
    c.total_epochs = float(a["epochs"])
    c.objective = "distillation"
    c.eval.evaluators = ("distillation",)
    c.distill.teacher = a["teacher"]
    c.distill.teacher_image_size = int(a["teacher_size"])
    c.distill.mode, c.distill.temperature, c.distill.alpha = "function_matching", 1.0, 1.0
    c.loss.mixup_alpha = 1.0
    c.loss.label_smoothing = 0.0
    c.optimizer.name = "adamw"
    c.optimizer.mu_dtype = "bfloat16"
    c.optimizer.lr, c.optimizer.weight_decay = 1e-3, 0.1
    c.optimizer.grad_clip_norm = 1.0
    c.optimizer.warmup_steps = 5_000
    c.optimizer.schedule = "cosine"
    c.mesh.fsdp = 4  # the teacher (R152x2: 236M parameters) and the student sharded over 4 devices
    c.log_every_steps = 50
    c.eval.every_epochs = 10.0
    c.checkpoint.every_steps = 1_000
    return c
