"""Inputs of `vit-jax analyze`: a checkpoint (any format load_any reads) and images at the model's resolution.

Images come from an array file (.npy, or .npz with key `images`), a folder of image files, or a dataset through
the data pipeline; all are returned as float32 (N, H, W, 3) in [-1, 1], the model's input convention.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

def load_checkpoint(path: str) -> tuple[Any, dict[str, Any]]:
    """(ViTConfig, params) of any Vision Transformer checkpoint vit_jax.checkpoints.loading.load_any reads; a BiT
    ResNet is a ValueError (every analysis reads attention, position embeddings or the patch embedding)."""
    from vit_jax.checkpoints.loading import load_any
    from vit_jax.models.build import family_of

    cfg, params = load_any(str(path))
    family = family_of(cfg)
    if not family.analyses:
        raise ValueError(f"{path} holds a {cfg.name} ({family.name} family) model: the analyses are of Vision "
                         "Transformers (attention, position embeddings, patch embedding), which it has none of")
    return cfg, params


def to_model_range(images: np.ndarray, image_size: tuple[int, int]) -> np.ndarray:
    """uint8 [0, 255] or float [-1, 1] images, (N, H, W[, C]) with C in {1, 3}, -> float32 (N, *image_size, 3)."""
    x = np.asarray(images)
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or x.shape[-1] not in (1, 3):
        raise ValueError(f"images must be (N, H, W, 3) or (N, H, W) (grayscale), got shape {x.shape}")
    if np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float32) / 127.5 - 1.0
    else:
        x = x.astype(np.float32)
        lo, hi = float(x.min()), float(x.max())
        if lo < -1.001 or hi > 1.001:
            raise ValueError(f"float images must be in [-1, 1] (got values in [{lo:.3g}, {hi:.3g}]); store uint8 "
                             "0..255 images or rescale with x / 127.5 - 1")
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    if tuple(x.shape[1:3]) != tuple(image_size):
        import jax

        x = np.asarray(jax.image.resize(x, (x.shape[0], *image_size, 3), method="bilinear"))
    return np.clip(x, -1.0, 1.0)


def images_from_array_file(path: str, image_size: tuple[int, int], max_images: int) -> np.ndarray:
    """Images from a .npy array or the `images` entry of a .npz file, in the model's range."""
    from vit_jax.data.image_files import read_image_array

    return to_model_range(read_image_array(path, max_images), image_size)


def images_from_folder(path: str, image_size: tuple[int, int], max_images: int) -> np.ndarray:
    """The first `max_images` readable image files of a folder (sorted by name), at the model's resolution
    (unreadable files are skipped with a line each)."""
    from vit_jax.data.image_files import default_eval_pp, read_image_folder

    folder = read_image_folder(path, default_eval_pp(image_size), max_images=max_images)
    for name, why in folder.skipped.items():
        print(f"skipped {name}: {why}")
    return folder.images


def images_from_dataset(name: str, split: str, image_size: tuple[int, int], max_images: int,
                        data_dir: str | None = None, pp: str | None = None) -> np.ndarray:
    """The first `max_images` examples of a dataset split through the data pipeline (eval order, no augmentation)."""
    import jax

    from vit_jax.data import pipeline

    h, w = image_size
    pp = pp or f"decode|resize({h},{w})|value_range(-1,1)"
    ds = pipeline.open_dataset(name, data_dir=data_dir)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    batch = min(max_images, 64, ds.num_examples(split))
    out: list[np.ndarray] = []
    it = pipeline.eval_iterator(ds, split, pp, global_batch_size=batch, sharding=sharding)
    try:
        for b in it:
            keep = np.asarray(b["_mask"]).astype(bool) if "_mask" in b else slice(None)
            out.append(np.asarray(b["image"])[keep])
            if sum(len(x) for x in out) >= max_images:
                break
    finally:
        if hasattr(it, "close"):
            it.close()
    return to_model_range(np.concatenate(out)[:max_images], image_size)


def load_images(*, images: str | None, dataset: str | None, split: str, image_size: tuple[int, int],
                max_images: int, data_dir: str | None = None, pp: str | None = None) -> np.ndarray:
    """Images from whichever source was given (see the module docstring)."""
    if images and dataset:
        raise ValueError("give either --images or --dataset, not both")
    if images:
        if os.path.isdir(images):
            return images_from_folder(images, image_size, max_images)
        if not os.path.isfile(images):
            raise FileNotFoundError(f"--images {images} does not exist (expected a .npy/.npz file or a folder)")
        if not images.endswith((".npy", ".npz")):
            raise ValueError(f"--images {images}: expected a .npy/.npz array file or a folder of images")
        return images_from_array_file(images, image_size, max_images)
    if dataset:
        return images_from_dataset(dataset, split, image_size, max_images, data_dir, pp)
    raise ValueError("this analysis needs images: pass --images FILE.npz|FOLDER or --dataset NAME --split SPLIT")
