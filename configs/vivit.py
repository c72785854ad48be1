"""ViViT on Kinetics-400: the paper's factorised-encoder recipe (Arnab et al., 2021, §4.1; the values of scenic's
projects/vivit/configs/kinetics400/vivit_base_factorised_encoder.py), from an ImageNet-21k ViT-B/16 inflated into
the video model (central-frame tubelet kernel, position embedding for the spatial encoder).

    python -m vit_jax.main --config=configs/vivit.py:data=kinetics400,init=ViT-B_16.npz --workdir=...
    args: data=NAME (a TFDS dataset with `label`), video=FEATURE (its TFDS `Video` feature, one encoded image per
    frame, as ucf101 and kinetics-style builders store clips: `video` for those; empty: each clip's frames stacked
    vertically in `image`, the layout decode_clip reads), frames=NUM stored frames per example of that stacked layout
    (default 64: 32 sampled 2 apart need 63), init=PATH (an image ViT-B/16: official .npz, timm .safetensors or a
    run), variant=ViViT-FE-B/16x2 | ViViT-B/16x2, epochs=30, views=TxS (evaluation views: T evenly spaced clips x S
    spatial crops, S 1 or 3; default 1x1, one central clip and crop; the paper's 4x3 classifies each video by the
    mean logits of 12 views, so each evaluation costs 12x).

Recipe (scenic's config): 32 frames at stride 2, the short side resized to 256 and a 224 crop, tubelets 2x16x16,
spatial ViT-B (12 blocks) then a 4-block temporal Transformer, class tokens; SGD with momentum 0.9, base lr 0.05,
cosine with 2.5 epochs of linear warmup, 30 epochs, batch 64, gradient clipping at norm 1, no weight decay (l2 0),
no label smoothing, no dropout. The paper's Kinetics-400 accuracies are measured with multi-view evaluation
(4 temporal x 3 spatial views, scenic's num_test_clips and do_three_spatial_crops).

Multi-view evaluation as the paper's: `views=4x3`, or, as scenic does (central views while training, the 4x3 test
at the end), evaluate the final checkpoint with `vit-jax eval --checkpoint W --pp` the 4x3 op string,
which `eval_pp(views=4, crops=3)` below builds.

Not applied (no clip ops for them yet): scale jitter (0.9-1.33), colour augmentation (p 0.8, colour drop 0.1).
With video=FEATURE only the sampled frames of each video are decoded (sample_clip before decode_frames).
"""

from vit_jax.errors import ConfigError
from vit_jax.train.config import default_config, parse_config_args

FRAMES, STRIDE, CROP, SHORT_SIDE = 32, 2, 224, 256
KINETICS_400_TRAIN = 214_834  # scenic's figure (the set shrinks as videos leave YouTube)


def eval_pp(video: str = "", frames: int = 64, views: int = 1, crops: int = 1) -> str:
    """The evaluation op string: `views` evenly spaced clips (1: the central one), each resized to SHORT_SIDE and
    cropped once at the centre (crops=1) or three times along the longer side (crops=3)."""
    if crops not in (1, 3):
        raise ConfigError(f"configs/vivit.py: {crops} spatial crops; give 1 or 3")
    sample = f"sample_clip({FRAMES}, stride={STRIDE}, random=False{f', views={views}' if views > 1 else ''}"
    clip = (f"{sample}, key='{video}')|decode_frames('{video}')" if video
            else f"decode_clip({frames})|{sample})")
    crop = f"three_crop_clip({CROP})" if crops == 3 else f"central_crop_clip({CROP})"
    return f"{clip}|resize_small_clip({SHORT_SIDE})|{crop}|value_range(-1,1)"


def get_config(arg=None):
    a = parse_config_args(arg, {"data": "kinetics400", "video": "", "frames": "64", "init": "",
                                "variant": "ViViT-FE-B/16x2", "epochs": "30", "views": "1x1"})
    try:
        views, crops = (int(n) for n in a["views"].split("x"))
        if views < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(f"configs/vivit.py: views={a['views']!r}; give TxS, e.g. 4x3") from None
    c = default_config()
    c.model.variant = a["variant"]
    c.model.num_frames = FRAMES
    c.model.image_size = CROP
    c.model.pool = "token"
    c.model.dtype = "bfloat16"
    c.data.name = a["data"]
    c.data.train_split, c.data.eval_split = "train", "validation"
    # Every frame is resized and cropped alike: the clip ops crop one window for all of them.
    if a["video"]:  # a TFDS Video feature: sample the encoded frames, then decode only those
        key = a["video"]
        train = f"sample_clip({FRAMES}, stride={STRIDE}, key='{key}')|decode_frames('{key}')"
    else:
        train = f"decode_clip({int(a['frames'])})|sample_clip({FRAMES}, stride={STRIDE})"
    c.data.pp_train = f"{train}|resize_small_clip({SHORT_SIDE})|random_crop_clip({CROP})|value_range(-1,1)"
    c.data.pp_eval = eval_pp(a["video"], int(a["frames"]), views, crops)
    c.batch_size = 64
    c.total_epochs = float(a["epochs"])
    c.optimizer.name = "sgd"
    c.optimizer.momentum = 0.9
    c.optimizer.lr = 0.05
    c.optimizer.weight_decay = 0.0
    c.optimizer.warmup_epochs = 2.5
    c.optimizer.schedule = "cosine"
    c.optimizer.grad_clip_norm = 1.0
    c.loss.label_smoothing = 0.0
    c.init.checkpoint = a["init"]
    c.init.required = True  # the recipe starts from ImageNet-21k weights
    c.init.reinit = ("head",)
    c.log_every_steps = 100
    c.eval.every_epochs = 1.0
    c.checkpoint.every_steps = 1_000  # scenic checkpoints more often than it evaluates
    return c
