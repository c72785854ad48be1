"""3-Augment (Touvron et al. 2022, DeiT III, section 3.1): per image one of grayscale, solarization or Gaussian blur,
chosen uniformly, then colour jitter. It replaces RandAugment in DeiT III's ImageNet-1k recipe (with a simple random
crop, flips, mixup/CutMix and the BCE loss).

    decode|resize_small(224)|random_crop(224)|flip_lr|three_augment(0.3)|value_range(-1,1)

- grayscale: ITU-R 601 luma (PIL's "L"), copied to the three channels;
- solarization: pixels >= 128 inverted (PIL's default threshold);
- Gaussian blur: radius (sigma) uniform in [0.1, 2.0], as the DeiT III code's GaussianBlur;
- colour jitter `jitter` (the paper's 0.3): brightness, contrast and saturation each scaled by a factor uniform in
  [1 - jitter, 1 + jitter], in a random order (torchvision's ColorJitter without hue); 0 turns it off.
It works on the uint8 image, so it goes before value_range / normalize.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

from vit_jax.data.pp import Example, Op, register

CHOICES = ("grayscale", "solarize", "blur")


def _grayscale(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    return ImageOps.grayscale(img).convert("RGB")


def _solarize(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    return ImageOps.solarize(img, 128)


def _blur(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    return img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.1, 2.0))))


TRANSFORMS = {"grayscale": _grayscale, "solarize": _solarize, "blur": _blur}
JITTER = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)


@register("three_augment")
def make_three_augment(jitter: float = 0.3) -> Op:
    """One of grayscale / solarize / blur per image (uniformly), then colour jitter of strength `jitter`."""
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"three_augment(jitter={jitter}): give a colour-jitter strength in [0, 1), e.g. 0.3")

    def op(ex: Example, rng: np.random.Generator) -> Example:
        image = ex["image"]
        if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError("op three_augment works on the decoded uint8 RGB image: put it after decode and before "
                             "value_range or normalize in the op string")
        img = TRANSFORMS[CHOICES[int(rng.integers(len(CHOICES)))]](Image.fromarray(image), rng)
        if jitter:
            for i in rng.permutation(len(JITTER)):
                img = JITTER[i](img).enhance(float(rng.uniform(1.0 - jitter, 1.0 + jitter)))
        return {**ex, "image": np.asarray(img)}

    return op
