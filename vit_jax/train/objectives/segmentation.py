"""`segmentation`: per-pixel cross-entropy on the model family's dense model (its `segmenter`, models/family.py: the
dense ViT with a pixel head, models/segmentation.py; a Swin's stage pyramid with an FPN-style head,
models/swin_segmentation.py; settings `segmentation.*`). It reads the batch's `segmentation` map (the decode_mask op), not the image labels. Its evaluator
`segmentation` reports mIoU and pixel accuracy from one confusion matrix over the eval split."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vit_jax.errors import ConfigError
from vit_jax.eval.segmentation import evaluate_segmentation, make_segmentation_eval_step
from vit_jax.models.family import family_for_variant, family_of
from vit_jax.models.segmentation import pixel_cross_entropy
from vit_jax.models.vit import FunctionalViT
from vit_jax.train.objectives.registry import register
from vit_jax.train.objectives.base import BatchFieldError, EvalReport, Objective, needs_rng

MASK_KEY = "segmentation"  # the batch field of the per-pixel labels


class MissingMaskError(BatchFieldError):
    """The batches carry no (or a misshapen) segmentation map."""


@register
class Segmentation(Objective):
    name = "segmentation"
    evaluator = "segmentation"
    settings = "segmentation"
    # Classes of the per-pixel labels (the batch's `segmentation` map, see the decode_mask op); label values outside
    # [0, num_classes) (e.g. 255) are ignored. A ViT needs model.dense=True (its family's dense_settings).
    defaults = dict(num_classes=0)
    uses_labels = False

    def __init__(self, model_cfg, num_classes: int):
        self.num_classes = num_classes
        family = family_of(model_cfg)
        if family.segmenter is None:
            raise ConfigError(f"objective='segmentation' needs a dense model, which the {family.name} family does "
                              "not have: choose a ViT (model.dense=True) or a Swin")
        module, self.flops = family.segmenter(model_cfg, num_classes)
        self.model = FunctionalViT(model_cfg, module)
        self.needs_rng = needs_rng(model_cfg)

    @classmethod
    def from_config(cls, config, model_cfg):
        return cls(model_cfg, config.segmentation.num_classes)

    @classmethod
    def check(cls, config):
        # The family of model.variant says which model.* values its dense model needs (a ViT's dense=True); with no
        # variant the init checkpoint decides the family, known only when it is read: its segmenter then checks.
        needs = {}
        if config.model.variant or not config.init.checkpoint:
            needs = family_for_variant(config.model.variant).dense_settings
        unset = [f"model.{k}={v}" for k, v in needs.items() if config.model.get(k) != v]
        if unset or config.segmentation.num_classes < 2:
            raise ConfigError(f"objective='segmentation' reads the dense features of its pixel labels' classes: set "
                              f"{' and '.join(unset + ['segmentation.num_classes (>= 2, background included)'])}")

    def batch_spec(self, batch_size):
        h, w = self.model.cfg.image_size
        return {"image": ((batch_size, h, w, 3), jnp.float32), MASK_KEY: ((batch_size, h, w), jnp.uint8)}

    def synthetic_batch(self, key, batch_size):
        k_img, k_map = jax.random.split(key)
        h, w = self.model.cfg.image_size
        return {"image": jax.random.uniform(k_img, (batch_size, h, w, 3), jnp.float32, -1.0, 1.0),
                MASK_KEY: jax.random.randint(k_map, (batch_size, h, w), 0, self.num_classes).astype(jnp.uint8)}

    def check_batch(self, batch):
        """A clear error (at trace time: shapes are static) when the op string did not produce an aligned map."""
        if MASK_KEY not in batch:
            raise MissingMaskError("objective 'segmentation' needs a `segmentation` map in every batch: add "
                                   "decode_mask (e.g. decode_mask('segmentation_mask')) to data.pp_train and "
                                   "data.pp_eval")
        if tuple(batch[MASK_KEY].shape[1:]) != tuple(batch["image"].shape[1:3]):
            raise MissingMaskError(f"segmentation maps {tuple(batch[MASK_KEY].shape[1:])} and images "
                                   f"{tuple(batch['image'].shape[1:3])} differ in size: resize/crop with ops after "
                                   "decode_mask, which move both")

    def inputs(self, batch, key):
        self.check_batch(batch)
        return {"image": batch["image"], MASK_KEY: batch[MASK_KEY]}

    def loss(self, params, inputs, key, extra=None):
        logits, _ = self.model.apply(params, inputs["image"], train=True, rng=key if self.needs_rng else None)
        return pixel_cross_entropy(logits, inputs[MASK_KEY])

    def eval_step(self):
        step = make_segmentation_eval_step(self.model)

        def eval_step(params, batch):
            self.check_batch(batch)
            return step(params, batch)

        return eval_step

    def evaluate(self, eval_step, params, batches):
        return evaluate_segmentation(eval_step, params, batches)

    def report(self, result, config):
        metrics = {"eval/miou": result["miou"], "eval/pixel_acc": result["pixel_acc"], "eval/loss": result["loss"],
                   "eval/count": result["count"]}
        return EvalReport(metrics, "eval/miou", True,
                          f"mIoU {100 * result['miou']:.2f}% | pixel acc {100 * result['pixel_acc']:.2f}% | "
                          f"loss {result['loss']:.4f} | {int(result['count'])} examples")
