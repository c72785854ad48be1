"""Demo: image-text pretraining of both towers from scratch on the digits with generated captions (#42).

    python -m vit_jax.main --config=configs/demo_clip.py --workdir=workdirs/demo_clip            # SigLIP (sigmoid)
    python -m vit_jax.main --config=configs/demo_clip.py:clip --workdir=workdirs/demo_clip_clip  # CLIP (softmax)

Images: the demo's 16x16 digits through a 4-block ViT of width 64 with a MAP head. Texts: a caption per image drawn
from 10 training templates x 3 names per digit (data/text_ops.py), tokenized by the demo's own SentencePiece model
(trained from those captions on first use), through a 2-block text Transformer. The evaluator reports zero-shot
top-1 on the test split with 4 held-out templates never seen in training, and image<->text recall@1/5/10 of the
test images with held-out captions (docs/image_text.md has the measured figures).
"""

from vit_jax.train.config import default_config


def get_config(arg=None):
    variant = arg or "siglip"
    if variant not in ("siglip", "clip"):
        raise ValueError(f"configs/demo_clip.py:{variant}: choose siglip or clip")
    c = default_config()
    c.seed = 0
    c.objective = variant
    c.model.variant = ""
    c.model.width, c.model.depth, c.model.mlp_dim, c.model.num_heads = 64, 4, 128, 4
    c.model.patch_size, c.model.image_size = 4, 16
    c.model.pool, c.model.posemb = "map", "learn"
    s = c[variant]
    s.embed_dim = 64
    s.text_vocab_size, s.text_max_len = 128, 16
    s.text_width, s.text_depth, s.text_heads, s.text_mlp_dim = 64, 2, 4, 128
    s.text_eos_id = 2  # the demo tokenizer's end-of-text id (CLIP pools there)
    s.tokenizer, s.zeroshot_classes = "digits", "digits"
    c.data.name = "digits"
    c.data.train_split, c.data.eval_split = "train", "test"
    c.data.pp_modules = ("vit_jax.data.text_ops",)
    c.data.pp_train = "decode|resize(18)|random_crop(16)|value_range(-1,1)|digit_caption('train')|tokenize('digits', 16)"
    c.data.pp_eval = "decode|resize(16)|value_range(-1,1)|digit_caption('heldout')|tokenize('digits', 16)"
    c.batch_size = 128
    c.total_epochs = 60.0
    c.optimizer.name = "adamw"
    c.optimizer.lr = 1e-3
    c.optimizer.weight_decay = 1e-4
    c.optimizer.warmup_epochs = 2.0
    c.optimizer.schedule = "cosine"
    c.optimizer.grad_clip_norm = 1.0
    c.loss.label_smoothing = 0.0
    c.log_every_steps = 50
    c.eval.evaluators = ("zeroshot" if variant == "siglip" else "clip_zeroshot",)
    c.eval.every_epochs = 20.0
    c.checkpoint.every_epochs = 20.0
    c.eval.fewshot.datasets = ()
    c.eval.fewshot.every_epochs = 0.0
    return c
