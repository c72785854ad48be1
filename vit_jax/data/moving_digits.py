"""`moving_digits`: the embedded default video dataset, clips generated from the embedded digits in seconds, offline.

Each clip is FRAMES frames of SIZE x SIZE pixels: one handwritten digit of the `digits` split of the same name (so
test digits never appear in train), scaled to DIGIT x DIGIT (bilinear, levels 0..255) on a black background, moving
in a straight line in one of four DIRECTIONS at one of SPEEDS (pixels per frame), from a start that keeps the whole
path inside the frame (its position rounded to whole pixels in each frame). Labels: `digit` (10), `direction` (4) and
`label` = digit * 4 + direction (40 classes: what a clip shows, both what and where to), with `labels` as the
other builders'. A clip is stored as one grayscale PNG of its frames stacked vertically (FRAMES*SIZE rows), which
the `decode_clip` op (data/video_ops.py) turns into (FRAMES, SIZE, SIZE, 3) uint8.

Every clip is drawn from its own generator, seeded by (SEED, split, index): the dataset is the same on every build.
Splits: train 4,000 / test 500 clips (more distinct clips, rather than more epochs over fewer, is what took the
video demo past 90%: docs/video.md).
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from vit_jax.data import digits, features
from vit_jax.data.decode import BuildReport

FRAMES, SIZE, DIGIT = 16, 32, 20
DIRECTIONS = {"right": (0, 1), "down": (1, 0), "left": (0, -1), "up": (-1, 0)}  # (row, column) step per frame
SPEEDS = (0.4, 0.75)  # the longest path, 15 frames at 0.75, moves 11.25 px of the 12 the frame leaves
SEED = 0
SPLITS = {"train": (0, 4000), "test": (1, 500)}  # split -> (seed stream, number of clips)
CLASS_NAMES = [f"{d}-{name}" for d in range(10) for name in DIRECTIONS]


def clip(pixels_0_16: np.ndarray, direction: int, speed: float, rng: np.random.Generator) -> np.ndarray:
    """One (FRAMES, SIZE, SIZE) uint8 clip of the 8x8 digit scan moving `speed` px per frame in `direction`."""
    dy, dx = list(DIRECTIONS.values())[direction]
    room, travel = SIZE - DIGIT, speed * (FRAMES - 1)
    start = []
    for step in (dy, dx):  # along the motion: where the whole path fits; across it: anywhere
        lo, hi = (travel, room) if step < 0 else (0, room - travel if step else room)
        start.append(rng.uniform(lo, hi))
    ink = digits.digit_gray(pixels_0_16, DIGIT)
    frames = np.zeros((FRAMES, SIZE, SIZE), np.uint8)
    for f in range(FRAMES):
        y, x = int(round(start[0] + dy * speed * f)), int(round(start[1] + dx * speed * f))
        frames[f, y:y + DIGIT, x:x + DIGIT] = ink
    return frames


def example(images: np.ndarray, targets: np.ndarray, pool: np.ndarray, rng: np.random.Generator) -> dict:
    """One clip's frames and labels, its digit drawn from `pool` (indices of the digits)."""
    i = int(pool[rng.integers(len(pool))])
    direction, speed = int(rng.integers(len(DIRECTIONS))), float(SPEEDS[rng.integers(len(SPEEDS))])
    digit = int(targets[i])
    return {"frames": clip(images[i], direction, speed, rng), "digit": digit, "direction": direction,
            "label": digit * len(DIRECTIONS) + direction}


class MovingDigits(features.LocalBuilderMixin, tfds.core.GeneratorBasedBuilder):
    """Clips of a handwritten digit moving in one of four directions (see module docstring)."""

    name = "moving_digits"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "16 frames of 32x32, a 20x20 digit moving right/down/left/up at 0.4 or 0.75 px per "
                              "frame; labels digit, direction and digit*4+direction; 4000/500."}

    def _info(self) -> tfds.core.DatasetInfo:
        return features.LocalDatasetInfo(
            builder=self,
            description="A scikit-learn handwritten digit moving across black 32x32 frames; 16 frames stacked in "
                        "one grayscale PNG.",
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(None, None, 1), encoding_format="png"),
                "label": tfds.features.ClassLabel(names=CLASS_NAMES),
                "labels": tfds.features.Sequence(tfds.features.ClassLabel(names=CLASS_NAMES)),
                "digit": tfds.features.ClassLabel(num_classes=10),
                "direction": tfds.features.ClassLabel(names=list(DIRECTIONS)),
                "id": tfds.features.Text(),
            }),
            supervised_keys=("image", "label"),
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
            ex = example(images, targets, pool, np.random.default_rng([SEED, stream, i]))
            key = f"clip_{split}_{i:05d}"
            self.build_report.add("kept", key)
            strip = ex["frames"].reshape(FRAMES * SIZE, SIZE)[:, :, None]
            yield i, {"image": digits.png_bytes(strip[:, :, 0]), "label": ex["label"], "labels": [ex["label"]],
                      "digit": ex["digit"], "direction": ex["direction"], "id": key}
