"""Masked patch prediction (the ViT paper's self-supervision, Dosovitskiy et al. 2021, §4.6 and appendix B.1.2).

Half of each image's patch embeddings are corrupted (of those, 80% replaced by a learnable [mask] embedding, 10% by
the embedding of another random patch of the image, 10% kept as they are, as in BERT), the ViT encoder runs on the
full sequence, and a linear head on each corrupted patch's output token predicts a target of that patch's pixels:
- `mean_color_3bit`: its mean colour at 3 bits per channel, one of 512 classes (the paper's reported setting);
- `color_4x4_3bit`: the patch downsized to 4x4 cells, each cell's 3-bit colour (16 predictions of 512 classes);
- `pixels_l2`: the patch's pixels, regressed with a squared error.

`MPPViT` is the project's ViT (same parameter names and shapes, no head) plus an `mpp` subtree (the [mask] embedding
and the prediction head), so an MPP run's encoder loads into a classification ViT for fine-tuning as it is.

Corruptions are drawn per example from `fold_in(key, row)` (`row` the example's index in the global batch), as MAE's
masks (models/mae.py), so they do not depend on how the batch is split over devices, processes or micro-batches.
Images are taken in the ViT's input range [-1, 1] (`value_range(-1,1)`); colours outside it are clipped.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax.models import layers as L
from vit_jax.models.config import ModelConfigError, ViTConfig
from vit_jax.models.vit import ViT

# fold_in constant of the corruptions' random stream: independent of the dropout keys of the same step.
CORRUPTION_STREAM = 0x4D505031
TARGETS = ("mean_color_3bit", "color_4x4_3bit", "pixels_l2")
COLORS = 512  # 3 bits per channel
# What happens to a corrupted patch's embedding.
MASK, RANDOM, KEEP = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class MPPConfig:
    """Masked patch prediction's settings. Defaults: the paper's (50% corrupted, 80/10/10, 3-bit mean colour)."""

    target: str = "mean_color_3bit"
    corrupt_ratio: float = 0.5  # fraction of each image's patches that are corrupted (and predicted)
    mask_prob: float = 0.8  # of the corrupted patches: replaced by the [mask] embedding
    random_prob: float = 0.1  # ... by another patch's embedding; the rest (0.1) keep their own

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ModelConfigError(f"mpp.target={self.target!r}: choose one of {', '.join(TARGETS)}")
        if not 0.0 < self.corrupt_ratio <= 1.0:
            raise ModelConfigError(f"mpp.corrupt_ratio={self.corrupt_ratio}: give a fraction in (0, 1], e.g. 0.5")
        if min(self.mask_prob, self.random_prob) < 0.0 or self.mask_prob + self.random_prob > 1.0:
            raise ModelConfigError(f"mpp.mask_prob={self.mask_prob} and mpp.random_prob={self.random_prob}: give "
                                   "probabilities >= 0 with a sum <= 1 (the rest keep their embedding), e.g. 0.8, 0.1")

    def num_corrupted(self, num_patches: int) -> int:
        """Patches corrupted per image: round(N * corrupt_ratio), at least 1."""
        return max(1, min(num_patches, round(num_patches * self.corrupt_ratio)))

    @property
    def cells(self) -> int:
        """Colour predictions per patch: 1 (mean colour), 16 (4x4 cells); 0 for the pixel regression."""
        return {"mean_color_3bit": 1, "color_4x4_3bit": 16}.get(self.target, 0)

    def num_outputs(self, patch_size: tuple[int, int]) -> int:
        """The prediction head's outputs per patch."""
        return self.cells * COLORS if self.cells else patch_size[0] * patch_size[1] * 3


def check_encoder(cfg: ViTConfig, mpp: MPPConfig) -> None:
    """The ViT options masked patch prediction supports: patches of pixels (no ResNet stem), and a class token or
    average pooling (a MAP head or pre-logits layer would get no training signal; a dense backbone has no tokens)."""
    bad = [name for name, on in (("resnet_layers", cfg.resnet_layers), ("dense", cfg.dense),
                                 ("rep_size", cfg.rep_size), ("pool='map'", cfg.pool == "map"),
                                 ("registers", cfg.registers)) if on]
    if bad:
        raise ModelConfigError(f"masked patch prediction pretrains a plain ViT; model.{', model.'.join(bad)} is not "
                               "supported with objective='masked_patch_prediction'")
    if cfg.num_classes:
        raise ModelConfigError("an MPP model has no classification head: build it with num_classes=0")
    if mpp.target == "color_4x4_3bit" and (cfg.patch_size[0] % 4 or cfg.patch_size[1] % 4):
        raise ModelConfigError(f"mpp.target='color_4x4_3bit' needs a patch size divisible by 4, not "
                               f"{cfg.patch_size}")
    if cfg.num_patches < 2:
        raise ModelConfigError("masked patch prediction needs at least 2 patches per image")


def corrupt_patches(key: jax.Array, rows: jax.Array, num_patches: int, mpp: MPPConfig) -> dict[str, jax.Array]:
    """The corruptions of a batch, example `i`'s from `fold_in(key, rows[i])`:
    `order` (B, N) int32: a random order of the patches, whose first K = num_corrupted are corrupted;
    `kind` (B, K) int32: MASK, RANDOM or KEEP for each of them, independently with the config's probabilities;
    `source` (B, K) int32: for RANDOM, the other patch whose embedding replaces it (uniform over the other N-1)."""
    k = mpp.num_corrupted(num_patches)

    def one(row):
        k_order, k_kind, k_source = jax.random.split(jax.random.fold_in(key, row), 3)
        order = jax.random.permutation(k_order, num_patches)
        u = jax.random.uniform(k_kind, (k,))
        kind = (u >= mpp.mask_prob).astype(jnp.int32) + (u >= mpp.mask_prob + mpp.random_prob).astype(jnp.int32)
        source = (order[:k] + jax.random.randint(k_source, (k,), 1, num_patches)) % num_patches
        return order, kind, source

    order, kind, source = jax.vmap(one)(rows)
    return {"order": order.astype(jnp.int32), "kind": kind, "source": source.astype(jnp.int32)}


def color_classes(images: jax.Array, patch_size: tuple[int, int], cells_per_side: int) -> jax.Array:
    """(B, N, cells_per_side**2) int32: the 3-bit colour class (r * 64 + g * 8 + b, each channel's mean over the
    cell quantised to 8 levels of [-1, 1]) of every cell of every patch, cells in row-major order."""
    ph, pw = patch_size
    c = cells_per_side
    patches = L.patchify(images.astype(jnp.float32), patch_size)
    b, n, _ = patches.shape
    cells = patches.reshape(b, n, c, ph // c, c, pw // c, 3).mean(axis=(3, 5)).reshape(b, n, c * c, 3)
    levels = jnp.clip(jnp.floor((cells + 1.0) * 4.0), 0, 7).astype(jnp.int32)  # [-1, 1] -> 8 bins of width 1/4
    return levels[..., 0] * 64 + levels[..., 1] * 8 + levels[..., 2]


def targets(images: jax.Array, patch_size: tuple[int, int], mpp: MPPConfig) -> jax.Array:
    """Every patch's target: (B, N, cells) colour classes, or (B, N, ph*pw*3) pixels for `pixels_l2`."""
    if mpp.cells:
        return color_classes(images, patch_size, 4 if mpp.cells == 16 else 1)
    return L.patchify(images.astype(jnp.float32), patch_size)


def prediction_loss(pred: jax.Array, target: jax.Array, mpp: MPPConfig) -> tuple[jax.Array, jax.Array | None]:
    """Per-example loss (B,) and accuracy (B,) (None for `pixels_l2`) of the predictions `pred` (B, K, outputs) for
    the corrupted patches' targets `target` (B, K, ...): softmax cross-entropy averaged over the patches (and
    cells), or the squared error averaged over their pixels."""
    if not mpp.cells:
        return jnp.square(pred.astype(jnp.float32) - target).mean(axis=(1, 2)), None
    logits = pred.astype(jnp.float32).reshape(*target.shape, COLORS)
    log_p = jax.nn.log_softmax(logits)
    xent = -jnp.take_along_axis(log_p, target[..., None], axis=-1)[..., 0]
    correct = (jnp.argmax(logits, axis=-1) == target).astype(jnp.float32)
    return xent.mean(axis=(1, 2)), correct.mean(axis=(1, 2))


class MPPHead(nnx.Module):
    """The learnable [mask] embedding and the linear prediction head (both dropped when fine-tuning)."""

    def __init__(self, cfg: ViTConfig, mpp: MPPConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        self.mask_embedding = L.param(rngs, L.normal(0.02), (1, 1, cfg.width), pd, (None, None, "embed"))
        self.pred = L.Linear(cfg.width, mpp.num_outputs(cfg.patch_size), ("embed", "vocab"),
                             kernel_init=L.xavier_uniform_flat(1), param_dtype=pd, rngs=rngs)


class MPPViT(ViT):
    """A ViT encoder (no head) and the MPP head. `module=functools.partial(MPPViT, mpp=...)` in FunctionalViT."""

    def __init__(self, cfg: ViTConfig, *, mpp: MPPConfig, rngs: nnx.Rngs):
        check_encoder(cfg, mpp)
        super().__init__(cfg, rngs=rngs)
        self.mpp = MPPHead(cfg, mpp, rngs=rngs)

    def corrupted_embeddings(self, images: jax.Array, order: jax.Array, kind: jax.Array,
                             source: jax.Array) -> jax.Array:
        """Images -> patch embeddings (B, N, D) with the first K patches of each `order` corrupted by `kind` and
        `source` (before the position embeddings: a patch keeps its position, only its content is replaced)."""
        x = self.embed(images)
        k = kind.shape[1]
        shuffled = jnp.take_along_axis(x, order[..., None], axis=1)  # in `order` order: the corrupted ones first
        mask = jnp.broadcast_to(self.mpp.mask_embedding[...].astype(x.dtype), shuffled[:, :k].shape)
        other = jnp.take_along_axis(x, source[..., None], axis=1)
        kind = kind[..., None]
        new = jnp.where(kind == MASK, mask, jnp.where(kind == RANDOM, other, shuffled[:, :k]))
        shuffled = jnp.concatenate([new, shuffled[:, k:]], axis=1)
        return jnp.take_along_axis(shuffled, jnp.argsort(order, axis=-1)[..., None], axis=1)  # back to grid order

    def predict(self, images: jax.Array, order: jax.Array, kind: jax.Array, source: jax.Array, *,
                rng: jax.Array | None = None) -> jax.Array:
        """Images and their corruption (`corrupt_patches`) -> (B, K, outputs) predictions for the corrupted patches,
        in `order` order. `rng` (training) drives the encoder's dropout and stochastic depth."""
        cfg = self.cfg
        patches, cls = self.add_positions(self.corrupted_embeddings(images, order, kind, source))
        x = patches if cls is None else jnp.concatenate([cls, patches], axis=1)
        k_embed, k_enc = jax.random.split(rng) if rng is not None else (None, None)
        x = L.dropout(x, cfg.dropout, k_embed)
        encoded, _, _ = self.encoder(x, key=k_enc)
        tokens = encoded[:, 1:] if cls is not None else encoded
        corrupted = jnp.take_along_axis(tokens, order[:, :kind.shape[1], None], axis=1)
        return self.mpp.pred(corrupted).astype(jnp.float32)
