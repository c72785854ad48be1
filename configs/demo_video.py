"""Demo: a small video ViT (ViViT's joint space-time encoder) trained from scratch on the embedded `moving_digits`
clips (a handwritten digit moving right, down, left or up): it must tell both the digit and the direction (40
classes), which no single frame shows.

Clips of 8 frames taken 2 apart (a random temporal crop of the 16 stored; the central one in evaluation), 32x32
frames cut into 2x8x8 tubelets: 4 time steps x 4 x 4 = 64 tokens and a class token, 4 blocks of width 64. Figures
(accuracy, wall time, the machine's load) and the command are in docs/video.md; benchmarks/demo_video.sh asserts the
target (>= 90% in <= 6 minutes): 91.8% in 186 s with an empty compilation cache (2026-12-06, 2 quiet cores).

    python -m vit_jax.main --config=configs/demo_video.py --workdir=workdirs/demo_video
"""

from vit_jax.train.config import default_config

FRAMES, STORED = 8, 16


def get_config(arg=None):
    del arg
    c = default_config()
    c.seed = 0
    c.model.variant = "ViViT-Ti/8x2"  # sizes below override the Ti ones
    c.model.width, c.model.depth, c.model.mlp_dim, c.model.num_heads = 64, 4, 128, 4
    c.model.num_frames = FRAMES
    c.model.image_size = 32
    c.model.pool = "token"
    c.data.name = "moving_digits"
    c.data.train_split, c.data.eval_split = "train", "test"
    c.data.pp_train = f"decode_clip({STORED})|sample_clip({FRAMES}, stride=2)|value_range(-1,1)"
    c.data.pp_eval = f"decode_clip({STORED})|sample_clip({FRAMES}, stride=2, random=False)|value_range(-1,1)"
    c.batch_size = 128
    c.total_epochs = EPOCHS
    c.optimizer.name = "adamw"
    c.optimizer.lr = 2e-3
    c.optimizer.weight_decay = 0.05
    c.optimizer.warmup_epochs = 2.0
    c.optimizer.schedule = "cosine"
    c.optimizer.grad_clip_norm = 1.0
    c.loss.label_smoothing = 0.1
    c.log_every_steps = 50
    c.eval.every_epochs = 10.0
    c.checkpoint.every_epochs = 10.0
    c.eval.fewshot.datasets = ()
    return c


EPOCHS = 30.0  # of 4,000 clips: 938 steps
