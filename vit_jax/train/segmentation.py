"""The segmentation objective (`config.objective = "segmentation"`) and its evaluator `segmentation`.

The model is the dense ViT with a pixel head (models/segmentation.py); the loss is the per-pixel softmax
cross-entropy on the batch's `segmentation` map (data.pp_* decode it with `decode_mask`, and their resize, crop and
flip ops move it with the image); the evaluator reports eval/miou and eval/pixel_acc from one confusion matrix over
the whole eval split (eval/segmentation.py), keeping the best mIoU.
"""

from __future__ import annotations

import functools

import jax

from vit_jax.errors import UserError
from vit_jax.eval.segmentation import evaluate_segmentation, make_segmentation_eval_step
from vit_jax.models.config import ViTConfig
from vit_jax.models.flops import segmentation_flops
from vit_jax.models.segmentation import SegmentationViT, pixel_cross_entropy
from vit_jax.models.vit import FunctionalViT
from vit_jax.train import hooks as hooks_lib
from vit_jax.train.objectives import REGISTERED, Objective, _needs_rng

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
    def __init__(self, model_cfg: ViTConfig, num_classes: int):
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


REGISTERED["segmentation"] = lambda config, model_cfg: Segmentation(model_cfg, config.segmentation.num_classes)


@hooks_lib.evaluator("segmentation")
class SegmentationEvalHook(hooks_lib.EvalHook):
    """mIoU and pixel accuracy on data.eval_split (every eval interval and at the end); the highest mIoU is the
    best."""

    def run(self, step, it):
        from vit_jax.data import pipeline

        ctx = self.ctx
        c = ctx.config
        batches = pipeline.eval_iterator(ctx.dataset, split=c.data.eval_split, pp=c.data.pp_eval,
                                         global_batch_size=c.eval.batch_size or c.batch_size,
                                         sharding=ctx.program.batch_sh)
        with batches:
            result = evaluate_segmentation(ctx.program.eval_step, ctx.params(), batches)
        self.last_step = step
        self.latest = {"eval/miou": result["miou"], "eval/pixel_acc": result["pixel_acc"], "eval/loss": result["loss"],
                       "eval/count": result["count"]}
        best = ctx.progress["best"]
        if result["miou"] >= best.get("eval/miou", -1.0):
            best.update({"eval/miou": result["miou"], "step": step})
        self.writer.write(step, {**self.latest, **hooks_lib.progress_scalars(ctx, step)})
        if jax.process_index() == 0:
            print(f"eval step {step}: mIoU {100 * result['miou']:.2f}% | pixel acc {100 * result['pixel_acc']:.2f}% | "
                  f"loss {result['loss']:.4f} | {int(result['count'])} examples", flush=True)
