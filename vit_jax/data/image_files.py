"""A folder of image files as one model-ready batch, or an array file of images: what `vit-jax predict` and
`vit-jax analyze` read.

Every file goes through the same decoding as training (data/decode.py: robust, pixel budget, 16-bit rescaled) and
an op string (the checkpoint's evaluation preprocessing). A file that cannot be read or decoded is skipped, with its
name and the reason, and counted; `strict=True` makes the first such file an error instead.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from vit_jax.data import pp as pp_lib
from vit_jax.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class UnreadableImageError(UserError, ValueError):
    """--strict: an image file could not be read or decoded."""


class ImageArrayError(UserError, ValueError):
    """An image array file without the expected `images` entry."""


def read_image_array(path: str, max_images: int | None = None) -> np.ndarray:
    """The images of a .npy array or of the `images` entry of a .npz file, as stored (no pickles; .npy memory-mapped,
    so only the first `max_images` are read)."""
    if not os.path.exists(path):
        raise ImageArrayError(f"{path} does not exist (give a .npy/.npz array of images or a folder of image files)")
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            if "images" not in z.files:
                raise ImageArrayError(f"{path} has no 'images' array (keys: {', '.join(z.files)}); save it as "
                                      "np.savez(path, images=...)")
            return z["images"][:max_images]
    return np.load(path, mmap_mode="r", allow_pickle=False)[:max_images]


@dataclasses.dataclass
class FolderImages:
    images: np.ndarray  # float32 (N, H, W, 3): the readable files, in name order
    names: list[str]  # their file names
    skipped: dict[str, str]  # unreadable file name -> why


def default_eval_pp(image_size: tuple[int, int]) -> str:
    """The official models' evaluation preprocessing: resize to the model resolution, values to [-1, 1]."""
    return f"decode|resize({image_size[0]},{image_size[1]})|value_range(-1,1)"


def image_names(folder: str) -> list[str]:
    names = sorted(f for f in os.listdir(folder) if f.lower().endswith(IMAGE_EXTENSIONS))
    if not names:
        raise UnreadableImageError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in {folder}")
    return names


def read_image_folder(folder: str, pp: str, *, strict: bool = False, max_images: int = 0,
                      shape: tuple[int, ...] | None = None) -> FolderImages:
    """Reads the image files of `folder` (sorted by name; the first `max_images` readable ones if > 0). With `shape`,
    a file whose preprocessed array has another shape (a clip of other frames, with no resize in `pp`) counts as
    unreadable; views of that shape (V, *shape), which a multi-view `pp` makes of every file alike, are read."""
    preprocess = pp_lib.build(pp_lib.strip_label_ops(pp))  # image files have no labels, and logits need none
    images, names, skipped = [], [], {}
    for name in image_names(folder):
        if max_images and len(images) >= max_images:
            break
        try:
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            image = preprocess({"image": data}, np.random.default_rng(0))["image"]
            got = tuple(np.shape(image))
            if shape is not None and (got[len(got) - len(shape):] != tuple(shape) or len(got) > len(shape) + 1):
                raise ValueError(f"preprocessed to shape {got}, the model takes {tuple(shape)}")
        except (OSError, ValueError) as e:  # DecodeError, or an op refusing the file's content (decode_clip's rows)
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            if strict:
                raise UnreadableImageError(f"{os.path.join(folder, name)}: {reason} (without --strict, unreadable "
                                           "files are skipped and counted)") from e
            skipped[name] = reason
            continue
        images.append(np.asarray(image, np.float32))
        names.append(name)
    if not images:
        raise UnreadableImageError(f"none of the {len(skipped)} image files in {folder} could be read; e.g. "
                                   f"{next(iter(skipped.items()), ('', ''))[0]}: {next(iter(skipped.values()), '')}")
    return FolderImages(np.stack(images), names, skipped)
