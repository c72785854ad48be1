"""Semantic segmentation on the dense ViT: a light head that classifies every pixel from its patch's token.

`SegmentationViT` is the project's ViT with `dense=True` (the (B, gh, gw, C) token map, through the neck if any) and a
`head`: a LayerNorm and one linear layer from each token to the logits of the ph x pw pixels of its patch (the
"pixel shuffle" of SETR-style linear decoders): (B, H, W, num_classes) logits at the input resolution, at the
cost of one matrix product. Its parameters are the ViT's plus `head/...`, so the encoder of a classification
checkpoint loads as it is, and the fine-tuning surgery (`init.reinit=("head",)`) gives the new head a fresh init.

Labels outside [0, num_classes) (e.g. 255, the usual "ignore" value) count in neither the loss nor the metrics.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax.models import layers as L
from vit_jax.models.config import ModelConfigError, ViTConfig
from vit_jax.models.vit import ViT


def pixels_per_token(cfg: ViTConfig) -> tuple[int, int]:
    """(rows, columns) of input pixels each token of the dense map covers (patch size x the hybrid stem's stride)."""
    (h, w), (gh, gw) = cfg.image_size, cfg.grid
    if h % gh or w % gw:
        raise ModelConfigError(f"segmentation needs an image size that is a multiple of the token grid: image "
                               f"{h}x{w}, grid {gh}x{gw}")
    return h // gh, w // gw


class PixelHead(nnx.Module):
    """LayerNorm + linear from a token to the logits of each of its ph x pw pixels (zero-initialised, as the
    ViT's classification head)."""

    def __init__(self, dim: int, pixels: tuple[int, int], num_classes: int, *, param_dtype, rngs):
        self.pixels, self.num_classes = pixels, num_classes
        self.norm = L.LayerNorm(dim, param_dtype=param_dtype, rngs=rngs)
        self.classifier = L.Linear(dim, pixels[0] * pixels[1] * num_classes, ("embed", "vocab"), kernel_init=L.zeros,
                                   param_dtype=param_dtype, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """(B, gh, gw, C) -> (B, gh * ph, gw * pw, num_classes)."""
        b, gh, gw, _ = tokens.shape
        (ph, pw), k = self.pixels, self.num_classes
        logits = self.classifier(self.norm(tokens)).reshape(b, gh, gw, ph, pw, k)
        return logits.transpose(0, 1, 3, 2, 4, 5).reshape(b, gh * ph, gw * pw, k)


class PyramidHead(nnx.Module):
    """A small FPN-style decoder (Lin et al. 2017) over a feature pyramid whose level s has half the rows and columns
    of level s - 1 (a Swin's stage outputs): each level is LayerNormed (as segmentation backbones normalise each output
    they expose) and projected 1x1 to `dim` channels (the laterals); from the coarsest level down, the running map is
    upsampled 2x (nearest) and added to the next finer lateral, so the finest map carries every level's features;
    a PixelHead then gives each of its tokens the logits of its pixels. No 3x3 smoothing convolutions or PPM
    (UPerNet's): one matrix product per level plus the pixel head keeps it light enough for the demo's CPU budget."""

    def __init__(self, dims: tuple[int, ...], dim: int, pixels: tuple[int, int], num_classes: int, *, param_dtype,
                 rngs):
        kw = dict(param_dtype=param_dtype, rngs=rngs)
        for s, d in enumerate(dims):
            setattr(self, f"norm{s}", L.LayerNorm(d, **kw))
            setattr(self, f"lateral{s}", L.Linear(d, dim, ("embed", None), kernel_init=L.xavier_uniform_flat(1),
                                                  **kw))
        self.levels = len(dims)
        self.pixels = PixelHead(dim, pixels, num_classes, **kw)

    def __call__(self, pyramid: tuple[jax.Array, ...]) -> jax.Array:
        """Levels (B, H/2**s, W/2**s, C_s) -> (B, H * ph, W * pw, num_classes) logits of the finest level's pixels."""
        if len(pyramid) != self.levels:
            raise ValueError(f"the head was built for {self.levels} pyramid levels, got {len(pyramid)}")
        x = None
        for s in reversed(range(self.levels)):
            lateral = getattr(self, f"lateral{s}")(getattr(self, f"norm{s}")(pyramid[s]))
            if x is not None:
                x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)[:, :lateral.shape[1], :lateral.shape[2]]
                lateral = lateral + x
            x = lateral
        return self.pixels(x)


class SegmentationViT(ViT):
    """A dense ViT and its pixel head. Build it as `functools.partial(SegmentationViT, num_classes=K)` in
    FunctionalViT. Call: `(logits (B, H, W, K) float32, out)`, `out` as the dense ViT's (tokens, dense,
    pre_logits)."""

    def __init__(self, cfg: ViTConfig, *, num_classes: int, rngs: nnx.Rngs):
        if not cfg.dense:
            raise ModelConfigError("segmentation reads the dense patch map: build the ViT with dense=True")
        if num_classes < 2:
            raise ModelConfigError(f"segmentation needs at least 2 classes (got {num_classes}): set "
                                   "segmentation.num_classes")
        super().__init__(cfg, rngs=rngs)
        # The ViT's `head` slot (None without classes) holds the pixel head: nnx.data marks it as parameters.
        self.head = nnx.data(PixelHead(cfg.neck_dim or cfg.width, pixels_per_token(cfg), num_classes,
                                       param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs))

    def __call__(self, images: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
                 capture: tuple[str, ...] = ()) -> tuple[jax.Array, dict[str, Any]]:
        _, out = super().__call__(images, train=train, rng=rng, capture=capture)
        return self.head(out["dense"]).astype(jnp.float32), out


def pixel_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None) -> jax.Array:
    """Mean softmax cross-entropy over the labelled pixels: logits (B, H, W, K), labels (B, H, W) integer classes
    (outside [0, K): ignored), optional per-example `weights` (B,). 0 when no pixel is labelled."""
    k = logits.shape[-1]
    labels = labels.astype(jnp.int32)
    valid = ((labels >= 0) & (labels < k)).astype(jnp.float32)
    if weights is not None:
        valid = valid * weights.astype(jnp.float32)[:, None, None]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    picked = jnp.take_along_axis(logp, jnp.clip(labels, 0, k - 1)[..., None], axis=-1)[..., 0]
    return -(picked * valid).sum() / jnp.maximum(valid.sum(), 1.0)


def confusion_matrix(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """(K, K) float32 counts of labelled pixels: row = true class, column = predicted class; `weights` (B,) is the
    eval mask (padding rows count 0)."""
    k = logits.shape[-1]
    labels = labels.astype(jnp.int32)
    valid = ((labels >= 0) & (labels < k)).astype(jnp.float32) * weights.astype(jnp.float32)[:, None, None]
    truth = jax.nn.one_hot(labels, k, dtype=jnp.float32) * valid[..., None]  # one_hot of an ignored label is 0s
    predicted = jax.nn.one_hot(jnp.argmax(logits, -1), k, dtype=jnp.float32)
    return jnp.einsum("bhwi,bhwj->ij", truth, predicted)
