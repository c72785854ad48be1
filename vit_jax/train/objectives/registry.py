"""The objectives registry: name -> Objective class (train/objectives/base.py says what an objective owns)."""

from __future__ import annotations

from typing import Any

import ml_collections

from vit_jax.errors import UserError
from vit_jax.train.objectives.base import Objective

OBJECTIVES: dict[str, type[Objective]] = {}
# What a config trains unless it says otherwise, and what a run recorded before objectives existed trained.
DEFAULT_OBJECTIVE = "classification"


def same_definition(a: object, b: object) -> bool:
    """Two classes from one definition: a config file that registers its own objective or family is executed again
    each time the config is read, which registers the same class anew."""
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def register(cls: type[Objective]) -> type[Objective]:
    """Registers an objective class under its `name` (and its evaluator under `evaluator`)."""
    assert cls.name and cls.evaluator, f"{cls.__name__} needs a name and an evaluator"
    if cls.name in OBJECTIVES and same_definition(OBJECTIVES[cls.name], cls):
        del OBJECTIVES[cls.name]
    assert cls.name not in OBJECTIVES, f"objective {cls.name} registered twice"
    taken = {o.evaluator: o.name for o in OBJECTIVES.values()}
    assert cls.evaluator not in taken, f"evaluator {cls.evaluator} is objective {taken.get(cls.evaluator)}'s"
    OBJECTIVES[cls.name] = cls
    return cls


class UnknownObjectiveError(UserError, ValueError):
    """A config or a run names an objective this installation has not registered."""


def objective_class(name: str) -> type[Objective]:
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise UnknownObjectiveError(f"unknown objective '{name}'; registered: {', '.join(OBJECTIVES)}") from None


def evaluator_objectives() -> dict[str, str]:
    """evaluator name -> the objective it evaluates."""
    return {cls.evaluator: name for name, cls in OBJECTIVES.items()}


def make_objective(config: ml_collections.ConfigDict, model_cfg: Any) -> Objective:
    """The objective of a (validated) training config, around the model `model_cfg` describes."""
    return objective_class(config.objective).from_config(config, model_cfg)
