"""Random erasing (Zhong et al. 2020), as DeiT trains with it (probability 0.25): a rectangle of the normalised image
replaced by noise.

With probability `p` an example draws a rectangle of `area_min`..`area_max` of the image's area and aspect ratio
log-uniform in [ratio, 1 / ratio] (up to 10 draws until one fits inside the image; none fitting leaves it whole), and
each of its pixels and channels becomes a standard-normal draw: the paper's and timm's per-pixel mode, which on an
image normalised to roughly zero mean and unit spread looks like the image's own statistics. It works on the
float image, so it goes after value_range / normalize in the op string:

    decode|inception_crop(224)|flip_lr|value_range(-1,1)|random_erasing(0.25)
"""

from __future__ import annotations

import math

import numpy as np

from vit_jax.data.pp import Example, Op, register

ATTEMPTS = 10


def erasing_box(rng: np.random.Generator, height: int, width: int, area_min: float, area_max: float,
                ratio: float) -> tuple[int, int, int, int] | None:
    """(top, left, h, w) of a rectangle inside the image, or None when no draw of ATTEMPTS fits."""
    for _ in range(ATTEMPTS):
        area = rng.uniform(area_min, area_max) * height * width
        aspect = math.exp(rng.uniform(math.log(ratio), -math.log(ratio)))
        h, w = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
        if 0 < h < height and 0 < w < width:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    return None


@register("random_erasing")
def make_random_erasing(p: float = 0.25, area_min: float = 0.02, area_max: float = 1 / 3,
                        ratio: float = 0.3) -> Op:
    """Erases one rectangle per example with probability p (DeiT: 0.25; the area and ratio defaults are the paper's)."""
    if not 0.0 <= p <= 1.0 or not 0.0 < area_min <= area_max < 1.0 or not 0.0 < ratio <= 1.0:
        raise ValueError(f"random_erasing(p={p}, area_min={area_min}, area_max={area_max}, ratio={ratio}): give a "
                         "probability, 0 < area_min <= area_max < 1 and 0 < ratio <= 1")

    def op(ex: Example, rng: np.random.Generator) -> Example:
        image = ex["image"]
        if not isinstance(image, np.ndarray) or image.dtype.kind != "f":
            raise ValueError("op random_erasing works on the normalised float image: put it after value_range or "
                             "normalize in the op string")
        if rng.uniform() >= p:
            return ex
        box = erasing_box(rng, image.shape[0], image.shape[1], area_min, area_max, ratio)
        if box is None:
            return ex
        top, left, h, w = box
        # In place: a float image is value_range's / normalize's own fresh output (often the batch row itself,
        # pp.IMAGE_OUT), shared with nothing.
        image[top:top + h, left:left + w] = rng.standard_normal((h, w, *image.shape[2:])).astype(image.dtype)
        return ex

    return op
