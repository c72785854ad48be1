"""What a run learns (`config.objective`): an objective brings its model, the per-example inputs its loss reads from
a batch, its loss, its evaluation step and its FLOPs. The one train step (step.py), the hooks, the checkpoints and
the sharding rules are the same for all of them.

- `classification`: softmax / sigmoid cross-entropy on the labels (with label smoothing and mixup);
- `mae`: masked autoencoder pretraining (models/mae.py); labels are not read. Its evaluator `reconstruction`
  (train/hooks.py) reports the reconstruction loss on the eval split, with masks fixed across evaluations.
- `masked_patch_prediction`: the ViT paper's self-supervision (models/mpp.py); labels are not read. Its evaluator
  `masked_patch` reports the masked-patch accuracy and loss on the eval split, with corruptions fixed likewise.
- `segmentation`: per-pixel cross-entropy on the dense ViT with a pixel head (models/segmentation.py); its evaluator
  `segmentation` (train/hooks.py) reports mIoU and pixel accuracy from one confusion matrix over the eval split.

This module is part of the pure train step: it knows nothing of hooks, data pipelines or checkpoints.
"""

from __future__ import annotations

import abc
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.data.mixup import mixup
from vit_jax.errors import UserError
from vit_jax.eval.segmentation import make_segmentation_eval_step
from vit_jax.eval.steps import make_eval_step
from vit_jax.models.build import ModelConfig, build_model
from vit_jax.models.flops import Flops, mae_flops, model_flops, mpp_flops, segmentation_flops
from vit_jax.models.losses import LOSSES, smooth_labels
from vit_jax.models.mae import MASK_STREAM, MAEConfig, MAEViT, masked, patch_orders, reconstruction_loss
from vit_jax.models.mpp import CORRUPTION_STREAM, MPPConfig, MPPViT, corrupt_patches, prediction_loss, targets
from vit_jax.models.segmentation import SegmentationViT, pixel_cross_entropy
from vit_jax.models.vit import FunctionalViT


class Objective(abc.ABC):
    """One training objective. `inputs` and `loss` together are the train step's loss:
    `loss(params, inputs(batch, key), key)`, where the inputs may be split row-wise into micro-batches first."""

    model: FunctionalViT
    flops: Flops  # per image, of what the train step runs

    @abc.abstractmethod
    def inputs(self, batch: dict[str, jax.Array], key: jax.Array) -> dict[str, jax.Array]:
        """The per-example arrays (leading axis: the global batch) the loss reads; `key` is the step's key."""

    @abc.abstractmethod
    def loss(self, params: Any, inputs: dict[str, jax.Array], key: jax.Array) -> jax.Array:
        """The mean loss over the rows of `inputs`; `key` drives dropout and the like."""

    @abc.abstractmethod
    def eval_step(self) -> Callable:
        """(params, eval batch with `_mask`) -> sums over the real rows: `count` and the metrics (eval/)."""


def _needs_rng(cfg: ModelConfig) -> bool:
    # Dropout and stochastic depth are ViT options (a BiT ResNet has none: its config has no such fields).
    return any(getattr(cfg, k, 0.0) for k in ("dropout", "attention_dropout", "drop_path"))


class Classification(Objective):
    def __init__(self, model: FunctionalViT, loss_kind: str = "softmax_xent", label_smoothing: float = 0.0,
                 mixup_alpha: float = 0.0):
        self.model, self.loss_kind = model, loss_kind
        self.label_smoothing, self.mixup_alpha = label_smoothing, mixup_alpha
        self.loss_fn = LOSSES[loss_kind]
        self.needs_rng = _needs_rng(model.cfg)
        self.flops = model_flops(model.cfg)

    def inputs(self, batch, key):
        return {"image": batch["image"],
                "labels": smooth_labels(batch["labels"].astype(jnp.float32), self.label_smoothing)}

    def loss(self, params, inputs, key):
        images, labels = inputs["image"], inputs["labels"]
        k_mix, k_model = jax.random.split(key)
        if self.mixup_alpha:
            mixed = mixup({"image": images, "labels": labels}, k_mix, self.mixup_alpha)
            images, labels = mixed["image"], mixed["labels"]
        logits, _ = self.model.apply(params, images, train=True, rng=k_model if self.needs_rng else None)
        return jnp.mean(self.loss_fn(logits, labels))

    def eval_step(self):
        return make_eval_step(self.model, self.loss_kind)


# The eval masks' key: one fixed key (not the run's seed), so every evaluation of every run scores the same masks.
EVAL_MASK_KEY = 0


class MAE(Objective):
    def __init__(self, model_cfg: ModelConfig, mae: MAEConfig):
        self.mae = mae
        self.model = FunctionalViT(model_cfg, functools.partial(MAEViT, mae=mae))
        self.num_patches = model_cfg.num_patches
        self.num_visible = mae.num_visible(self.num_patches)
        self.needs_rng = _needs_rng(model_cfg)
        self.flops = mae_flops(model_cfg, mae)

    def orders(self, key: jax.Array, batch_size: int) -> jax.Array:
        """(B, N) patch orders of a global batch: row i's from fold_in(fold_in(key, MASK_STREAM), i)."""
        return patch_orders(jax.random.fold_in(key, MASK_STREAM), jnp.arange(batch_size), self.num_patches)

    def per_example_loss(self, params, images, orders, rng=None) -> jax.Array:
        cfg = self.model.cfg
        pred = self.model.bind(params).reconstruct(images, orders, rng=rng)
        return reconstruction_loss(pred, images, masked(orders, self.num_visible), cfg.patch_size,
                                   self.mae.norm_pix_loss)

    def inputs(self, batch, key):
        return {"image": batch["image"], "orders": self.orders(key, batch["image"].shape[0])}

    def loss(self, params, inputs, key):
        rng = key if self.needs_rng else None
        return jnp.mean(self.per_example_loss(params, inputs["image"], inputs["orders"], rng))

    def eval_step(self):
        def eval_step(params, batch):
            images = batch["image"]
            orders = self.orders(jax.random.key(EVAL_MASK_KEY), images.shape[0])
            mask = batch["_mask"].astype(jnp.float32)
            return {"count": mask.sum(),
                    "reconstruction_loss": (self.per_example_loss(params, images, orders) * mask).sum()}

        return eval_step


class MaskedPatchPrediction(Objective):
    def __init__(self, model_cfg: ModelConfig, mpp: MPPConfig):
        self.mpp = mpp
        self.model = FunctionalViT(model_cfg, functools.partial(MPPViT, mpp=mpp))
        self.num_patches = model_cfg.num_patches
        self.needs_rng = _needs_rng(model_cfg)
        self.flops = mpp_flops(model_cfg, mpp)

    def corruption(self, key: jax.Array, batch_size: int) -> dict[str, jax.Array]:
        """The corruptions of a global batch (models/mpp.py corrupt_patches): row i's from
        fold_in(fold_in(key, CORRUPTION_STREAM), i)."""
        return corrupt_patches(jax.random.fold_in(key, CORRUPTION_STREAM), jnp.arange(batch_size), self.num_patches,
                               self.mpp)

    def per_example(self, params, inputs, rng=None) -> tuple[jax.Array, jax.Array | None]:
        """(loss (B,), accuracy (B,) or None) of the predictions for each example's corrupted patches."""
        images, order, kind = inputs["image"], inputs["order"], inputs["kind"]
        pred = self.model.bind(params).predict(images, order, kind, inputs["source"], rng=rng)
        target = jnp.take_along_axis(targets(images, self.model.cfg.patch_size, self.mpp),
                                     order[:, :kind.shape[1], None], axis=1)
        return prediction_loss(pred, target, self.mpp)

    def inputs(self, batch, key):
        return {"image": batch["image"], **self.corruption(key, batch["image"].shape[0])}

    def loss(self, params, inputs, key):
        return jnp.mean(self.per_example(params, inputs, key if self.needs_rng else None)[0])

    def eval_step(self):
        def eval_step(params, batch):
            images = batch["image"]
            inputs = {"image": images, **self.corruption(jax.random.key(EVAL_MASK_KEY), images.shape[0])}
            loss, accuracy = self.per_example(params, inputs)
            mask = batch["_mask"].astype(jnp.float32)
            sums = {"count": mask.sum(), "mpp_loss": (loss * mask).sum()}
            if accuracy is not None:  # the colour targets are classes; the pixel regression has no accuracy
                sums["mpp_accuracy"] = (accuracy * mask).sum()
            return sums

        return eval_step


def mae_config(config: ml_collections.ConfigDict) -> MAEConfig:
    return MAEConfig(**config.mae.to_dict())


def mpp_config(config: ml_collections.ConfigDict) -> MPPConfig:
    return MPPConfig(**config.mpp.to_dict())


MASK_KEY = "segmentation"


class MissingMaskError(UserError, ValueError):
    """The batches carry no (or a misshapen) segmentation map."""


def check_batch(batch: dict) -> None:
    """A clear error (at trace time: shapes are static) when the op string did not produce an aligned map."""
    if MASK_KEY not in batch:
        raise MissingMaskError("objective 'segmentation' needs a `segmentation` map in every batch: add "
                               "decode_mask (e.g. decode_mask('segmentation_mask')) to data.pp_train and data.pp_eval")
    if tuple(batch[MASK_KEY].shape[1:]) != tuple(batch["image"].shape[1:3]):
        raise MissingMaskError(f"segmentation maps {tuple(batch[MASK_KEY].shape[1:])} and images "
                               f"{tuple(batch['image'].shape[1:3])} differ in size: resize/crop with ops after "
                               "decode_mask, which move both")


class Segmentation(Objective):
    def __init__(self, model_cfg: ModelConfig, num_classes: int):
        self.num_classes = num_classes
        self.model = FunctionalViT(model_cfg, functools.partial(SegmentationViT, num_classes=num_classes))
        self.needs_rng = _needs_rng(model_cfg)
        self.flops = segmentation_flops(model_cfg, num_classes)

    def inputs(self, batch, key):
        check_batch(batch)
        return {"image": batch["image"], MASK_KEY: batch[MASK_KEY]}

    def loss(self, params, inputs, key):
        logits, _ = self.model.apply(params, inputs["image"], train=True, rng=key if self.needs_rng else None)
        return pixel_cross_entropy(logits, inputs[MASK_KEY])

    def eval_step(self):
        step = make_segmentation_eval_step(self.model)

        def eval_step(params, batch):
            check_batch(batch)
            return step(params, batch)

        return eval_step


def make_objective(config: ml_collections.ConfigDict, model_cfg: ModelConfig) -> Objective:
    """The objective of a (validated) training config, around the model `model_cfg` describes."""
    if config.objective == "mae":
        return MAE(model_cfg, mae_config(config))
    if config.objective == "masked_patch_prediction":
        return MaskedPatchPrediction(model_cfg, mpp_config(config))
    if config.objective == "segmentation":
        return Segmentation(model_cfg, config.segmentation.num_classes)
    return Classification(build_model(model_cfg), config.loss.kind, config.loss.label_smoothing,
                          config.loss.mixup_alpha)
