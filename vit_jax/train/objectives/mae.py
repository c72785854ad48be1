"""`mae`: masked autoencoder pretraining (models/mae.py; settings `mae.*`, defaults the MAE paper's); labels are not
read. Its evaluator `reconstruction` reports the reconstruction loss on the eval split, with masks fixed across
evaluations (one fixed key, not the run's seed, so every evaluation of every run scores the same masks)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from vit_jax.models.flops import mae_flops
from vit_jax.models.mae import MASK_STREAM, MAEConfig, MAEViT, masked, patch_orders, reconstruction_loss
from vit_jax.models.vit import FunctionalViT
from vit_jax.train.objectives.registry import register
from vit_jax.train.objectives.base import EvalReport, Objective, needs_rng

EVAL_MASK_KEY = 0


@register
class MAE(Objective):
    name = "mae"
    evaluator = "reconstruction"
    settings, settings_type = "mae", MAEConfig  # defaults: the MAE paper's
    uses_labels = False
    pretraining = True

    def __init__(self, model_cfg, mae: MAEConfig):
        self.mae = mae
        self.model = FunctionalViT(model_cfg, functools.partial(MAEViT, mae=mae))
        self.num_patches = model_cfg.num_patches
        self.num_visible = mae.num_visible(self.num_patches)
        self.needs_rng = needs_rng(model_cfg)
        self.flops = mae_flops(model_cfg, mae)

    @classmethod
    def from_config(cls, config, model_cfg):
        return cls(model_cfg, cls.settings_of(config))

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

    def loss(self, params, inputs, key, extra=None):
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

    def report(self, result, config):
        loss = result["reconstruction_loss"]
        return EvalReport({"eval/reconstruction_loss": loss, "eval/count": result["count"]},
                          "eval/reconstruction_loss", False,
                          f"reconstruction loss {loss:.4f} | {int(result['count'])} examples")


mae_config = MAE.settings_of  # config -> MAEConfig
