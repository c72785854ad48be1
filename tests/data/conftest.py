"""Fixtures for the data tests: tiny generated images, archives in the official ImageNet layout, digits."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth random uint8 RGB image (compresses like a photo, not like noise)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(2, h // 8), max(2, w // 8), 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC))


def encode(pixels: np.ndarray, fmt: str = "JPEG", mode: str | None = None, **kw) -> bytes:
    img = Image.fromarray(pixels)
    if mode:
        img = img.convert(mode)
    out = io.BytesIO()
    img.save(out, fmt, **({"quality": 90} if fmt == "JPEG" and not kw else kw))
    return out.getvalue()


def bad_images(seed: int = 0) -> dict[str, bytes]:
    """One image of each difficult kind, keyed by the build-report kind it must produce."""
    good = encode(photo(40, 48, seed))
    return {
        "converted_cmyk": encode(photo(40, 48, seed + 1), mode="CMYK"),
        "converted_grayscale": encode(photo(40, 48, seed + 2), mode="L"),
        "converted_png": encode(photo(40, 48, seed + 3), fmt="PNG"),
        "skipped_corrupt": b"\xff\xd8\xff\xe0 this is not really a jpeg" + bytes(100),
        "skipped_truncated": good[: len(good) // 2],
        "skipped_tiny": encode(photo(4, 5, seed + 4)),
    }


def write_tar(path: Path, files: dict[str, bytes], mode: str = "w:") -> None:
    with tarfile.open(path, mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def synset_tar_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def imagenet_synsets(count: int, images_per_synset: int, seed: int = 0, synsets: list[str] | None = None):
    """{synset: {"<synset>_<k>.JPEG": jpeg bytes}} for the first `count` synsets of the given list."""
    return {s: {f"{s}_{k}.JPEG": encode(photo(24 + k % 3, 30, seed * 1000 + i * 50 + k))
                for k in range(images_per_synset)}
            for i, s in enumerate(synsets[:count])}


@pytest.fixture(scope="session")
def digits_ds(tmp_path_factory):
    from vit_jax.data import datasets

    return datasets.open_dataset("digits", data_dir=str(tmp_path_factory.mktemp("tfds")))


@pytest.fixture(scope="session")
def gen():
    """The image/archive generators above (test modules cannot import conftest in importlib mode)."""
    import types

    return types.SimpleNamespace(photo=photo, encode=encode, bad_images=bad_images, write_tar=write_tar,
                                 synset_tar_bytes=synset_tar_bytes, imagenet_synsets=imagenet_synsets)
