"""RandAugment (Cubuk et al. 2019) on uint8 images with PIL: `randaug(n, m)`.

The standard 16-op list of the reference TPU implementation. Per layer one op is drawn uniformly and applied
with probability uniform(0.2, 0.8). Magnitudes m are on the 0..10 scale and always grow stronger with m (the
reference implementation's posterize/solarize/enhance ops weaken with m, a known quirk we do not reproduce).
Geometric ops fill uncovered pixels with gray (128).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from vit_jax.data.pp import Example, Op, register

MAX_LEVEL = 10.0
FILL = (128, 128, 128)


def _signed(value: float, rng: np.random.Generator) -> float:
    return -value if rng.uniform() < 0.5 else value


def _affine(img: Image.Image, matrix: tuple) -> Image.Image:
    return img.transform(img.size, Image.Transform.AFFINE, matrix, resample=Image.Resampling.NEAREST, fillcolor=FILL)


def _enhance(enhancer):
    # Factor 1 is the identity; m=10 moves it by +-0.9 (0.1 .. 1.9, the reference range).
    return lambda img, m, rng: enhancer(img).enhance(1.0 + _signed(0.9 * m / MAX_LEVEL, rng))


def _solarize_add(img: Image.Image, m: float, rng: np.random.Generator) -> Image.Image:
    a = np.asarray(img).astype(np.int16)
    added = np.clip(a + int(110 * m / MAX_LEVEL), 0, 255)
    return Image.fromarray(np.where(a < 128, added, a).astype(np.uint8))


def _cutout(img: Image.Image, m: float, rng: np.random.Generator) -> Image.Image:
    # The reference cuts a (2*pad)^2 square with pad = 40 px at m=10 on 224 px images: keep that proportion.
    a = np.array(img)
    h, w = a.shape[:2]
    pad = int(round(40 / 224 * min(h, w) * m / MAX_LEVEL))
    cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
    a[max(0, cy - pad) : cy + pad, max(0, cx - pad) : cx + pad] = FILL
    return Image.fromarray(a)


def _translate(axis: int):
    # 100 px at m=10 on 224 px images in the reference: 0.45 of the image side.
    def op(img: Image.Image, m: float, rng: np.random.Generator) -> Image.Image:
        shift = _signed(0.45 * img.size[axis] * m / MAX_LEVEL, rng)
        return _affine(img, (1, 0, shift, 0, 1, 0) if axis == 0 else (1, 0, 0, 0, 1, shift))

    return op


def _shear(axis: int):
    def op(img: Image.Image, m: float, rng: np.random.Generator) -> Image.Image:
        s = _signed(0.3 * m / MAX_LEVEL, rng)
        return _affine(img, (1, s, 0, 0, 1, 0) if axis == 0 else (1, 0, 0, s, 1, 0))

    return op


OPS = {
    "AutoContrast": lambda img, m, rng: ImageOps.autocontrast(img),
    "Equalize": lambda img, m, rng: ImageOps.equalize(img),
    "Invert": lambda img, m, rng: ImageOps.invert(img),
    "Rotate": lambda img, m, rng: img.rotate(_signed(30 * m / MAX_LEVEL, rng), fillcolor=FILL),
    "Posterize": lambda img, m, rng: ImageOps.posterize(img, 8 - int(4 * m / MAX_LEVEL)),
    "Solarize": lambda img, m, rng: ImageOps.solarize(img, 256 - int(256 * m / MAX_LEVEL)),
    "SolarizeAdd": _solarize_add,
    "Color": _enhance(ImageEnhance.Color),
    "Contrast": _enhance(ImageEnhance.Contrast),
    "Brightness": _enhance(ImageEnhance.Brightness),
    "Sharpness": _enhance(ImageEnhance.Sharpness),
    "ShearX": _shear(0),
    "ShearY": _shear(1),
    "TranslateX": _translate(0),
    "TranslateY": _translate(1),
    "Cutout": _cutout,
}
OP_NAMES = tuple(OPS)


def rand_augment(image: np.ndarray, num_layers: int, magnitude: float, rng: np.random.Generator) -> np.ndarray:
    """Applies `num_layers` random RandAugment ops of the given magnitude to a uint8 (H, W, 3) image."""
    img = Image.fromarray(image)
    for _ in range(num_layers):
        name = OP_NAMES[int(rng.integers(0, len(OP_NAMES)))]
        prob = rng.uniform(0.2, 0.8)
        if rng.uniform() < prob:
            img = OPS[name](img, magnitude, rng)
    return np.asarray(img)


@register("randaug")
def make_randaug(n: int = 2, m: float = 10) -> Op:
    """RandAugment with n layers of magnitude m (0..10) on the uint8 image (place it before value_range)."""

    def op(ex: Example, rng: np.random.Generator) -> Example:
        image = ex["image"]
        if not (isinstance(image, np.ndarray) and image.dtype == np.uint8):
            raise ValueError("randaug needs a decoded uint8 image: put it after decode/crop and before value_range")
        if "segmentation" in ex:  # its rotations and shears would leave the label map behind
            raise ValueError("randaug does not move a segmentation map with the image: drop it from a segmentation "
                             "op string (crops and flips do move both)")
        return {**ex, "image": rand_augment(image, n, m, rng)}

    return op
