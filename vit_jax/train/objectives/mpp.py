"""`masked_patch_prediction`: the ViT paper's self-supervision (models/mpp.py; settings `mpp.*`, defaults the
paper's); labels are not read. Its evaluator `masked_patch` reports the masked-patch accuracy and loss on the eval
split, with the corruptions fixed across evaluations; the highest accuracy is the best (the lowest loss for the pixel
regression target, which has no accuracy)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from vit_jax.models.flops import mpp_flops
from vit_jax.models.mpp import CORRUPTION_STREAM, MPPConfig, MPPViT, corrupt_patches, prediction_loss, targets
from vit_jax.models.vit import FunctionalViT
from vit_jax.train.objectives.registry import register
from vit_jax.train.objectives.base import EvalReport, Objective, needs_rng
from vit_jax.train.objectives.mae import EVAL_MASK_KEY


@register
class MaskedPatchPrediction(Objective):
    name = "masked_patch_prediction"
    evaluator = "masked_patch"
    settings, settings_type = "mpp", MPPConfig  # defaults: the ViT paper's
    uses_labels = False
    pretraining = True

    def __init__(self, model_cfg, mpp: MPPConfig):
        self.mpp = mpp
        self.model = FunctionalViT(model_cfg, functools.partial(MPPViT, mpp=mpp))
        self.num_patches = model_cfg.num_patches
        self.needs_rng = needs_rng(model_cfg)
        self.flops = mpp_flops(model_cfg, mpp)

    @classmethod
    def from_config(cls, config, model_cfg):
        return cls(model_cfg, cls.settings_of(config))

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

    def loss(self, params, inputs, key, extra=None):
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

    def report(self, result, config):
        metrics = {f"eval/{k}": result[k] for k in ("mpp_accuracy", "mpp_loss", "count") if k in result}
        accuracy = f"accuracy {100 * result['mpp_accuracy']:.2f}% | " if "mpp_accuracy" in result else ""
        line = f"masked patches: {accuracy}loss {result['mpp_loss']:.4f} | {int(result['count'])} examples"
        if "mpp_accuracy" in result:
            return EvalReport(metrics, "eval/mpp_accuracy", True, line)
        return EvalReport(metrics, "eval/mpp_loss", False, line)


mpp_config = MaskedPatchPrediction.settings_of  # config -> MPPConfig
