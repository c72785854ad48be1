"""`digits`: the embedded default dataset, built in seconds with no download.

scikit-learn's handwritten digits (1,797 real 8x8 grayscale scans, values 0..16, shipped inside scikit-learn),
scaled to 0..255, upscaled to 32x32 with bilinear filtering, replicated to RGB and stored as PNG (lossless).
Split: stratified 80/20 with a fixed seed -> train 1,437 / test 360 examples, 10 classes.
"""

from __future__ import annotations

import io

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from vit_jax.data import features
from vit_jax.data.decode import BuildReport

IMAGE_SIZE = 32
SPLIT_SEED = 0
TEST_FRACTION = 0.2
NUM_TRAIN, NUM_TEST = 1437, 360


def split_indices(targets: np.ndarray) -> dict[str, np.ndarray]:
    """The sorted example indices of the train and test splits (stratified by class, fixed seed)."""
    from sklearn.model_selection import train_test_split

    index = np.arange(len(targets))
    train, test = train_test_split(index, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=targets)
    return {"train": np.sort(train), "test": np.sort(test)}


def digit_gray(pixels_0_16: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
    """An 8x8 digit (values 0..16) as a size x size uint8 gray image (values scaled to 0..255, bilinear)."""
    gray = np.clip(np.rint(pixels_0_16.reshape(8, 8) * (255 / 16)), 0, 255).astype(np.uint8)
    return np.asarray(Image.fromarray(gray).resize((size, size), Image.Resampling.BILINEAR))


def png_bytes(pixels: np.ndarray) -> bytes:
    """A uint8 (H, W) or (H, W, 3) array as PNG bytes."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def digit_png(pixels_0_16: np.ndarray, size: int = IMAGE_SIZE) -> bytes:
    """An 8x8 digit (values 0..16) as a size x size RGB PNG."""
    return png_bytes(np.repeat(digit_gray(pixels_0_16, size)[:, :, None], 3, axis=2))


class Digits(features.LocalBuilderMixin, tfds.core.GeneratorBasedBuilder):
    """scikit-learn's handwritten digits as a TFDS dataset (see module docstring)."""

    name = "digits"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "32x32 RGB PNG, stratified 80/20 split with seed 0."}

    def _info(self) -> tfds.core.DatasetInfo:
        return features.LocalDatasetInfo(
            builder=self,
            description="scikit-learn handwritten digits (UCI optdigits test set), 32x32 RGB.",
            features=features.image_features([str(d) for d in range(10)], encoding="png"),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        from sklearn.datasets import load_digits

        data = load_digits()
        self.build_report = BuildReport()
        return {split: self._generate_examples(data.images, data.target, indices)
                for split, indices in split_indices(data.target).items()}

    def _generate_examples(self, images, targets, indices):
        for i in indices:
            self.build_report.add("kept", str(i))
            yield int(i), features.example(digit_png(images[i]), int(targets[i]), f"digit_{i:04d}")
