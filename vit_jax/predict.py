"""`vit-jax predict --checkpoint CKPT --images IMAGES --output logits.npy`: logits of any checkpoint on images.

IMAGES is an `.npy`, or an `.npz` with key `images`, of model-ready NHWC float images (no preprocessing applied), or a
folder of image files, which get the checkpoint's evaluation preprocessing: the one recorded in our training
checkpoints, otherwise the official models' (resize to the model resolution, values to [-1, 1]).

--image-size is for checkpoints that do not record their resolution (fixed sin-cos posemb, non-square patch grid);
with an array of images it defaults to the images' own height and width.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.checkpoints.convert import describe, load_with_size, parse_size
from vit_jax.models.vit import FunctionalViT

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")


def load_image_folder(folder: str, size: tuple[int, int], pp: str | None = None) -> tuple[np.ndarray, list[str]]:
    """Reads every image file of `folder` (sorted by name) and applies the evaluation preprocessing."""
    names = sorted(f for f in os.listdir(folder) if f.lower().endswith(IMAGE_EXTENSIONS))
    if not names:
        raise FileNotFoundError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in {folder}")
    if pp:
        from vit_jax.data import pp as pp_lib

        fn = pp_lib.build(pp_lib.strip_label_ops(pp))  # image files have no labels, and logits need none
        images = []
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                images.append(fn({"image": f.read()}, np.random.default_rng(0))["image"])
        return np.stack(images).astype(np.float32), names
    from PIL import Image

    images = []
    for name in names:
        with Image.open(os.path.join(folder, name)) as im:
            im = im.convert("RGB").resize((size[1], size[0]), Image.BILINEAR)
            images.append(np.asarray(im, np.float32) / 127.5 - 1.0)
    return np.stack(images), names


def load_image_array(path: str) -> np.ndarray:
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            if "images" not in z.files:
                raise KeyError(f"{path} has no 'images' array (keys: {z.files})")
            return np.asarray(z["images"], np.float32)
    return np.asarray(np.load(path, allow_pickle=False), np.float32)


def predict(params, cfg, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be (N, H, W, 3), got {images.shape}")
    model = FunctionalViT(cfg)
    fn = jax.jit(lambda p, x: model.apply(p, x)[0])
    params = jax.tree.map(jnp.asarray, params)
    out = []
    for i in range(0, len(images), batch_size):
        chunk = images[i:i + batch_size]
        n = len(chunk)
        if n < batch_size and len(images) > batch_size:  # pad the tail: one compiled shape
            chunk = np.concatenate([chunk, np.zeros((batch_size - n, *chunk.shape[1:]), chunk.dtype)])
        out.append(np.asarray(fn(params, jnp.asarray(chunk)))[:n])
    return np.concatenate(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vit-jax predict", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--images", required=True, help=".npy / .npz (key 'images') array, or a folder of image files")
    ap.add_argument("--output", required=True, help="where to write the logits (.npy)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=0, help="also print the top-k classes of each image")
    ap.add_argument("--image-size", type=parse_size,
                    help="model resolution, e.g. 224 or 384x512, for checkpoints that do not record it (default for "
                         ".npy/.npz images: their own size)")
    args = ap.parse_args(argv)

    images = None if os.path.isdir(args.images) else load_image_array(args.images)
    size = args.image_size
    if size is None and images is not None and images.ndim == 4:
        size = tuple(images.shape[1:3])  # a mismatch with a recorded size is reported below, as before
    loaded = load_with_size(args.checkpoint, size, "--image-size", must_match=args.image_size is not None)
    if loaded is None:
        return 2
    cfg, params = loaded
    print(f"checkpoint {args.checkpoint}: {describe(cfg)}")
    if images is None:
        pp = _recorded_eval_pp(args.checkpoint)
        images, names = load_image_folder(args.images, cfg.image_size, pp)
    else:
        names = [str(i) for i in range(len(images))]
    if tuple(images.shape[1:3]) != tuple(cfg.image_size):
        print(f"error: images are {images.shape[1]}x{images.shape[2]} but the model expects "
              f"{cfg.image_size[0]}x{cfg.image_size[1]}; convert with --image-size to change the resolution",
              file=sys.stderr)
        return 2
    logits = predict(params, cfg, images, args.batch_size)
    np.save(args.output, logits)
    print(f"wrote {args.output}: logits {logits.shape}")
    if args.top_k:
        for name, row in zip(names, logits):
            top = np.argsort(-row)[:args.top_k]
            print(f"{name}: " + ", ".join(f"{c} ({row[c]:.3f})" for c in top))
    return 0


def _recorded_eval_pp(path: str) -> str | None:
    """The eval preprocessing stored in one of our training checkpoints (None for official/timm files)."""
    if not os.path.isdir(path):
        return None
    from vit_jax.checkpoints.training import load_run_metadata

    meta = load_run_metadata(path)
    return (meta or {}).get("pp_eval")


if __name__ == "__main__":
    sys.exit(main())
