"""`digits_mosaic`: a segmentation set generated from the embedded digits, built in seconds with no download.

Each example is a 32x32 RGB image cut into 4x4 cells of 8x8; each cell holds, with probability 0.75, one digit of
the `digits` split of the same name (so test digits never appear in train) at its scan's own 8x8 resolution
(levels 0..16 scaled to 0..255), over a background of uniform noise (levels 0..48). Its per-pixel label
`segmentation` (uint8 PNG, one channel) is 0 for the background and 1 + d where the ink of digit d is at least level
96: 11 classes. The image is the maximum of noise and ink, so the label is a function of what is seen.
(`CELL`/`TILE` allow larger, offset digits; this size makes a demo that trains in minutes on a CPU.)

Every example is drawn from its own generator, seeded by (SEED, split, index): the dataset is the same on every
build. Splits: train 2,000 / test 500 mosaics.
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from vit_jax.data import digits, features
from vit_jax.data.decode import BuildReport

IMAGE_SIZE, CELL, TILE = 32, 8, 8
DIGIT_PROBABILITY = 0.75
NOISE_MAX, INK_MIN = 48, 96
NUM_CLASSES = 11  # background + 10 digits
SEED = 0
SPLITS = {"train": (0, 2000), "test": (1, 500)}  # split -> (seed stream, number of mosaics)


def mosaic(images: np.ndarray, targets: np.ndarray, pool: np.ndarray,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One (image (S, S, 3) uint8, segmentation (S, S) uint8) pair from digits drawn out of `pool` (indices)."""
    image = rng.integers(0, NOISE_MAX + 1, (IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    seg = np.zeros((IMAGE_SIZE, IMAGE_SIZE), np.uint8)
    for cy in range(0, IMAGE_SIZE, CELL):
        for cx in range(0, IMAGE_SIZE, CELL):
            if rng.uniform() >= DIGIT_PROBABILITY:
                continue
            i = int(pool[rng.integers(len(pool))])
            y, x = cy + int(rng.integers(0, CELL - TILE + 1)), cx + int(rng.integers(0, CELL - TILE + 1))
            ink = digits.digit_gray(images[i], TILE)
            window = (slice(y, y + TILE), slice(x, x + TILE))
            image[window] = np.maximum(image[window], ink)
            seg[window] = np.where(ink >= INK_MIN, 1 + int(targets[i]), seg[window])
    return np.repeat(image[:, :, None], 3, axis=2), seg


class DigitsMosaic(features.LocalBuilderMixin, tfds.core.GeneratorBasedBuilder):
    """Mosaics of handwritten digits with per-pixel labels (see module docstring)."""

    name = "digits_mosaic"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "32x32 mosaics of 4x4 cells of 8x8 digits on noise, 11-class masks; 2000/500."}

    def _info(self) -> tfds.core.DatasetInfo:
        return features.LocalDatasetInfo(
            builder=self,
            description="Mosaics of scikit-learn handwritten digits with per-pixel labels (0 background, 1+digit).",
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(None, None, 3), encoding_format="png"),
                "segmentation": tfds.features.Image(shape=(None, None, 1), encoding_format="png"),
                "id": tfds.features.Text(),
            }),
            supervised_keys=("image", "segmentation"),
        )

    def _split_generators(self, dl_manager):
        from sklearn.datasets import load_digits

        data = load_digits()
        self.build_report = BuildReport()
        pools = digits.split_indices(data.target)
        return {split: self._generate_examples(data.images, data.target, pools[split], split) for split in SPLITS}

    def _generate_examples(self, images, targets, pool, split):
        stream, count = SPLITS[split]
        for i in range(count):
            image, seg = mosaic(images, targets, pool, np.random.default_rng([SEED, stream, i]))
            key = f"mosaic_{split}_{i:05d}"
            self.build_report.add("kept", key)
            yield i, {"image": digits.png_bytes(image), "segmentation": digits.png_bytes(seg), "id": key}
