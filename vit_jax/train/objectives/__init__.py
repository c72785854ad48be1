"""What a run learns (`config.objective`), chosen by name from the objectives registered in registry.py.

Built in: `classification` (classification.py), `distillation` (distillation.py), `mae` (mae.py),
`masked_patch_prediction` (mpp.py), `segmentation` (segmentation.py) and `vjepa` (vjepa.py), imported here so that
they are registered.
A new objective is a module with an `Objective` subclass decorated with `registry.register`; the config schema,
validation, the trainer, its evaluator, `vit-jax eval`, `plan` and `bench` then find it by name (base.py says what an
objective owns). A module outside the package registers the same way (a test's toy objective does) before its config
is validated.
"""

from vit_jax.train.objectives.base import BatchFieldError, EvalReport, Objective, needs_rng
from vit_jax.train.objectives.classification import Classification
from vit_jax.train.objectives.dino import Dino, dino_config
from vit_jax.train.objectives.distillation import Distillation, distill_config
from vit_jax.train.objectives.image_text import CLIP, SigLIP
from vit_jax.train.objectives.mae import MAE, mae_config
from vit_jax.train.objectives.mpp import MaskedPatchPrediction, mpp_config
from vit_jax.train.objectives.registry import (DEFAULT_OBJECTIVE, OBJECTIVES, UnknownObjectiveError,
                                               evaluator_objectives, make_objective, objective_class, register)
from vit_jax.train.objectives.segmentation import MissingMaskError, Segmentation
from vit_jax.train.objectives.vjepa import VJEPA, vjepa_config

__all__ = ["CLIP", "SigLIP", "DEFAULT_OBJECTIVE", "OBJECTIVES", "BatchFieldError", "Classification", "Dino", "dino_config", "Distillation", "distill_config",
           "EvalReport", "MAE", "MaskedPatchPrediction", "MissingMaskError", "Objective", "Segmentation",
           "UnknownObjectiveError", "evaluator_objectives",
           "mae_config", "make_objective", "mpp_config", "needs_rng", "objective_class", "register", "VJEPA",
           "vjepa_config"]
