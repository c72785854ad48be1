"""`vjepa`: V-JEPA pretraining without labels (models/vjepa.py; settings `vjepa.*`, defaults the paper's ViT-L
recipe). The extra state is the target encoder: a copy of the encoder at step 0 (`extra_from_params`), then an EMA of
it with a momentum rising linearly from ema_start to ema_end over the run. The loss is the mean absolute error
between the predictor's output and the target encoder's layer-normalised features at the masked tokens, averaged
over the two mask types (short- and long-range blocks). Its evaluator reports that loss on the eval split with masks
fixed across evaluations, and the target features' spread across clips (`eval/target_std`, the collapse check)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from vit_jax.models.flops import Flops, _block_flops
from vit_jax.models.video_family import video_flops
from vit_jax.models.vit import FunctionalViT
from vit_jax.models.vjepa import MASK_STREAM, VJEPAConfig, VJEPAViT, check_encoder, mask_orders
from vit_jax.train.objectives.base import EvalReport, Objective, needs_rng
from vit_jax.train.objectives.registry import register

EVAL_MASK_KEY = 0
ENCODER = ("embedding", "pos_embedding", "encoder")  # the parameters the target encoder mirrors


@register
class VJEPA(Objective):
    name = "vjepa"
    evaluator = "vjepa"
    settings, settings_type = "vjepa", VJEPAConfig
    uses_labels = False
    pretraining = True
    extra_from_params = True

    def __init__(self, model_cfg, vjepa: VJEPAConfig):
        check_encoder(model_cfg, vjepa)
        self.vjepa = vjepa
        self.model = FunctionalViT(model_cfg, functools.partial(VJEPAViT, vjepa=vjepa))
        self.specs = vjepa.masks()
        nt, gh, gw = model_cfg.grid
        self.num_context = [nt * (gh * gw - spec.num_masked((gh, gw))) for spec in self.specs]
        self.needs_rng = needs_rng(model_cfg)
        self.flops = self._flops(model_cfg)

    @classmethod
    def from_config(cls, config, model_cfg):
        return cls(model_cfg, cls.settings_of(config))

    def _flops(self, cfg) -> Flops:
        """Per clip: the target encoder on every token (no backward: frozen), the tubelet embedding of the clip
        (once: both mask types take their context from it), and per mask type the context encoder on its context
        tokens and the predictor on all tokens (matrix products only); with `masks_per_step` 1, each mask type's
        share is its expected one, half."""
        video = video_flops(cfg)
        full = video.forward
        n, d, pw = cfg.num_tubelets, cfg.width, self.vjepa.predictor_width
        share = 1.0 if self.vjepa.masks_per_step == 2 else 0.5
        parts = {"embedding": video.breakdown["tubelet_embedding"]}
        for i, k in enumerate(self.num_context):
            parts[f"context_encoder{i}"] = share * cfg.depth * _block_flops(k, d, cfg.mlp_dim)
            parts[f"predictor{i}"] = share * (self.vjepa.predictor_depth * _block_flops(n, pw, 4 * pw) +
                                              2.0 * 2 * n * d * pw)
        return Flops(forward=sum(parts.values()), breakdown={**parts, "target_encoder": full}, frozen_forward=full)

    # --- extra state: the target encoder --------------------------------------------------------------------------
    def init_extra(self, key, params=None):
        return {k: params[k] for k in ENCODER}

    def extra_logical_axes(self):
        return {k: self.model.logical_axes[k] for k in ENCODER}

    def momentum(self, step):
        frac = jnp.clip(step / max(self.total_steps, 1), 0.0, 1.0)
        return self.vjepa.ema_start + (self.vjepa.ema_end - self.vjepa.ema_start) * frac

    def update_extra(self, extra, params, step):
        m = self.momentum(step)
        return jax.tree.map(lambda t, p: m * t + (1.0 - m) * p.astype(t.dtype), extra,
                            {k: params[k] for k in ENCODER})

    # --- the loss ------------------------------------------------------------------------------------------------
    def orders(self, key, batch_size):
        rows = jnp.arange(batch_size)
        base = jax.random.fold_in(key, MASK_STREAM)
        return [mask_orders(jax.random.fold_in(base, i), rows, spec, self.model.cfg.grid)
                for i, spec in enumerate(self.specs)]

    def inputs(self, batch, key):
        b = batch["image"].shape[0]
        short, long = self.orders(key, b)
        out = {"image": batch["image"], "short": short, "long": long}
        if self.vjepa.masks_per_step == 1:
            # One type for the whole step, drawn here from the step's key (not in `loss`, whose key differs per
            # micro-batch), and repeated per example so that a micro-batch split keeps it.
            pick = jax.random.bernoulli(jax.random.fold_in(key, MASK_STREAM + 1)).astype(jnp.int32)
            out["mask_type"] = jnp.full((b,), pick)
        return out

    def targets(self, params, extra, clips):
        """The target encoder's layer-normalised features of every token (B, N, D), without gradient."""
        return self.model.bind({**params, **jax.lax.stop_gradient(extra)}).targets(clips)

    def per_example_loss(self, params, extra, clips, orders, rng=None, targets=None, mask_type=None):
        """(B,) loss averaged over the mask types; with `mask_type` (a traced 0 or 1) that type's alone, the other
        not computed (lax.switch runs one branch)."""
        if targets is None:
            targets = self.targets(params, extra, clips)
        model = self.model.bind(params)
        tokens = model.tokens(clips)  # embedded once for both masks

        def mask_loss(i):
            k, order = self.num_context[i], orders[i]
            pred = model.predict(tokens, order, k, i, rng=None if rng is None else jax.random.fold_in(rng, i))
            target = jnp.take_along_axis(targets, order[:, k:, None], axis=1)
            return jnp.abs(pred.astype(jnp.float32) - target).mean(axis=(1, 2))

        if mask_type is not None:
            return jax.lax.switch(mask_type, [functools.partial(mask_loss, i) for i in range(len(orders))])
        return sum(mask_loss(i) for i in range(len(orders))) / len(orders)

    def loss(self, params, inputs, key, extra=None):
        rng = key if self.needs_rng else None
        mask_type = inputs["mask_type"][0] if "mask_type" in inputs else None
        return jnp.mean(self.per_example_loss(params, extra, inputs["image"], (inputs["short"], inputs["long"]), rng,
                                              mask_type=mask_type))

    def eval_step(self):
        def eval_step(state, batch):
            params, extra = state
            clips = batch["image"]
            orders = self.orders(jax.random.key(EVAL_MASK_KEY), clips.shape[0])
            mask = batch["_mask"].astype(jnp.float32)
            targets = self.targets(params, extra, clips)
            loss = self.per_example_loss(params, extra, clips, orders, targets=targets)
            return {"count": mask.sum(), "vjepa_loss": (loss * mask).sum(),
                    "target_std": target_spread(targets, mask) * mask.sum()}

        return eval_step

    def report(self, result, config):
        loss, spread = result["vjepa_loss"], result["target_std"]
        return EvalReport({"eval/vjepa_loss": loss, "eval/target_std": spread, "eval/count": result["count"]},
                          "eval/vjepa_loss", False,
                          f"V-JEPA loss {loss:.4f} | target std {spread:.4f} | {int(result['count'])} examples")


def target_spread(targets: jax.Array, mask: jax.Array) -> jax.Array:
    """The collapse check: the standard deviation of the target features across the batch's clips (rows where
    `mask` is 1), at each token position and channel, averaged. The targets are layer-normalised per token, so a
    healthy encoder gives a value of order 1; 0 means the target encoder maps every clip to the same features (full
    collapse, or features that only encode the position), the trivial solution V-JEPA's EMA and predictor must
    avoid."""
    w = mask[:, None, None]
    n = jnp.maximum(mask.sum(), 1.0)
    mean = (targets * w).sum(0) / n
    var = (jnp.square(targets - mean) * w).sum(0) / n
    return jnp.sqrt(var).mean()


vjepa_config = VJEPA.settings_of  # config -> VJEPAConfig
