"""`vit-jax predict --checkpoint CKPT --images IMAGES --output logits.npy`: logits of any checkpoint on images.

IMAGES is an `.npy`, or an `.npz` with key `images`, of model-ready NHWC float images (no preprocessing applied), or a
folder of image files, which get the checkpoint's evaluation preprocessing: the one recorded in our training
checkpoints, otherwise the official models' (resize to the model resolution, values to [-1, 1]). A file of the
folder that cannot be read or decoded (not an image, empty, over the pixel budget) is skipped with its name and
reason, and counted; `--strict` makes it an error. For a folder, OUTPUT.json lists the file of each logits row and
the skipped files with their reasons.

--features picks what is written: `logits` (classifiers), or for dense backbones (SAM-style, e.g. a timm
`samvit_base_patch16` .safetensors) `dense`, the model's feature map (the neck's output when it has one), or
`tokens`, the (N, gh, gw, D) patch-token map before the neck; both NHWC. A dense backbone writes `dense` by default.

A two-tower (image-text) checkpoint (a siglip/clip run, or a big_vision SigLIP .npz) writes image embeddings, and
with --texts FILE text embeddings and zero-shot logits (commands/predict_image_text.py).

A video checkpoint (a video run of ours, a transformers ViViT .safetensors) takes clips: an array (N, T, H, W, 3), or
one clip (T, H, W, 3), model-ready; or a folder of clip files, each one image of its frames stacked vertically
(moving_digits' layout), given the run's evaluation preprocessing (for other checkpoints: the model's T frames of its
size, values to [-1, 1]).

--image-size is for checkpoints that do not record their resolution (fixed sin-cos posemb, non-square patch grid);
with an array of images it defaults to the images' own height and width.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from vit_jax import cli_args
from vit_jax.checkpoints.loading import load_with_size, parse_size
from vit_jax.data.image_files import default_eval_pp, read_image_array, read_image_folder
from vit_jax.eval.inference import FEATURES, features_mismatch, predict
from vit_jax.eval.steps import example_shape, has_views
from vit_jax.models.build import describe

def main(argv: list[str] | None = None) -> int:
    ap = cli_args.ArgumentParser(prog="vit-jax predict", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--images", required=True, help=".npy / .npz (key 'images') array, or a folder of image files")
    ap.add_argument("--output", type=cli_args.output_path, required=True, help="where to write the logits (.npy)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=0, help="also print the top-k classes of each image")
    ap.add_argument("--features", choices=FEATURES, help="what to write: logits (classifiers), or a dense backbone's "
                    "dense (default; after the neck) or tokens (before it) feature map, NHWC")
    ap.add_argument("--strict", action="store_true", help="an unreadable image file is an error (default: skipped)")
    ap.add_argument("--image-size", type=parse_size,
                    help="model resolution, e.g. 224 or 384x512, for checkpoints that do not record it (default for "
                         ".npy/.npz images: their own size)")
    ap.add_argument("--texts", help="two-tower checkpoints: a file of texts, one per line, to embed and score against "
                    "each image (zero-shot logits)")
    ap.add_argument("--tokenizer", help="two-tower checkpoints: the text tower's SentencePiece .model (default: the "
                    "run's)")
    args = ap.parse_args(argv)

    images = None if os.path.isdir(args.images) else np.asarray(read_image_array(args.images), np.float32)
    from vit_jax.train.objectives.image_text import load_image_text

    two_towers = load_image_text(args.checkpoint)  # image-text: embeddings, not logits (commands/predict_image_text.py)
    if two_towers is not None:
        from vit_jax.commands.predict_image_text import predict_image_text

        return predict_image_text(args, *two_towers, images)
    if args.texts or args.tokenizer:
        ap.error("--texts and --tokenizer are for two-tower (image-text) checkpoints")
    size = args.image_size
    if size is None and images is not None and images.ndim in (4, 5):
        # images (N, H, W, 3), a clip (T, H, W, 3) or clips (N, T, H, W, 3): a mismatch with a recorded size is
        # reported below, as before
        size = tuple(images.shape[-3:-1])
    loaded = load_with_size(args.checkpoint, size, "--image-size", must_match=args.image_size is not None)
    if loaded is None:
        return 2
    cfg, params = loaded
    print(f"checkpoint {args.checkpoint}: {describe(cfg)}")
    skipped: dict[str, str] | None = None
    if images is None:
        folder = read_image_folder(args.images, _recorded_eval_pp(args.checkpoint) or _default_pp(cfg),
                                   strict=args.strict, shape=example_shape(cfg))
        images, names, skipped = folder.images, folder.names, folder.skipped
        for name, why in skipped.items():
            print(f"skipped {name}: {why}", file=sys.stderr)
    else:
        names = [str(i) for i in range(len(images))]
    want = example_shape(cfg)
    if len(want) == 4 and images.ndim == 4:
        images = images[None]  # one clip
    if images.ndim == 4 and len(want) == 3 and tuple(images.shape[1:3]) != tuple(cfg.image_size):
        print(f"error: images are {images.shape[1]}x{images.shape[2]} but the model expects "
              f"{cfg.image_size[0]}x{cfg.image_size[1]}; convert with --image-size to change the resolution",
              file=sys.stderr)
        return 2
    # (N, V, ...): each example's views (a run's multi-view eval preprocessing), classified by their mean logits
    if images.ndim != len(want) + 1 + has_views(cfg, images.ndim) or tuple(images.shape[-len(want):]) != want:
        what = "clips (N, T, H, W, 3) or one clip" if len(want) == 4 else "images (N, H, W, 3)"
        print(f"error: {args.images}: the model takes {what} of shape {want}, got {images.shape}", file=sys.stderr)
        return 2
    features = args.features or ("dense" if cfg.dense else "logits")
    if (features == "logits") == cfg.dense or (args.top_k and features != "logits"):
        print(f"error: --features {features}{' with --top-k' if args.top_k else ''}: {features_mismatch(cfg)}",
              file=sys.stderr)
        return 2
    logits = predict(params, cfg, images, args.batch_size, features)
    np.save(args.output, logits)
    counted = f"; skipped {len(skipped)} unreadable file(s)" if skipped else ""
    print(f"wrote {args.output}: {features} {logits.shape}{counted}")
    if skipped is not None:
        with open(args.output + ".json", "w") as f:
            json.dump({"files": names, "skipped": skipped}, f, indent=1)
    if args.top_k:
        for name, row in zip(names, logits):
            top = np.argsort(-row)[:args.top_k]
            print(f"{name}: " + ", ".join(f"{c} ({row[c]:.3f})" for c in top))
    return 0


def _default_pp(cfg) -> str:
    """The preprocessing of files for a checkpoint that records none: the official models' for images; for clips,
    the model's frames stacked vertically in one image, values to [-1, 1]."""
    shape = example_shape(cfg)
    if len(shape) == 4:
        return f"decode_clip({shape[0]})|value_range(-1,1)"
    return default_eval_pp(cfg.image_size)


def _recorded_eval_pp(path: str) -> str | None:
    """The eval preprocessing stored in one of our training checkpoints (None for official/timm files)."""
    if not os.path.isdir(path):
        return None
    from vit_jax.checkpoints.training import load_run_metadata

    meta = load_run_metadata(path)
    return (meta or {}).get("pp_eval")


if __name__ == "__main__":
    sys.exit(main())
