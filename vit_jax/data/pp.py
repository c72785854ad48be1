"""Preprocessing op strings: `decode_jpeg_and_inception_crop(224)|flip_lr|value_range(-1,1)|onehot(1000)`.

Each `|`-separated piece is an op call written in Python syntax with literal arguments only (parsed with `ast`,
never `eval`). An op factory registered with `@register("name")` takes those arguments and returns an
`Op(example, rng) -> example`: a function of one example dict (numpy values on the host) and that example's own
`np.random.Generator`, so every random choice is reproducible from (seed, example position).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from typing import Any, Callable

import numpy as np

from vit_jax.errors import UserError

Example = dict[str, Any]
Op = Callable[[Example, np.random.Generator], Example]

# Optional key of an example: a float32 array offered by the pipeline as the destination of the final image (its
# row of the batch). An op that maps pixels to float32 (value_range, normalize) writes its result into it when the
# shapes match, and removes the key; this saves an allocation and a copy per example. Other ops pass it along.
IMAGE_OUT = "_image_out"

_REGISTRY: dict[str, Callable[..., Op]] = {}


def strip_label_ops(pp: str) -> str:
    """The op string without its label ops (onehot, multihot): for images with no label of that dataset (few-shot
    on another dataset's classes, or plain image files to predict on)."""
    return "|".join(op for op in pp.split("|") if not op.strip().startswith(("onehot", "multihot")))


def register(name: str) -> Callable[[Callable[..., Op]], Callable[..., Op]]:
    """Registers an op factory under `name` (used in op strings)."""

    def wrap(factory: Callable[..., Op]) -> Callable[..., Op]:
        assert name not in _REGISTRY, f"op {name} registered twice"
        _REGISTRY[name] = factory
        return factory

    return wrap


# Op modules register their ops on import (their @register decorators run). This module imports them by name, as
# big_vision's `pp_modules` does, so the registry never imports the ops that import it, and a config adds its own
# modules with `data.pp_modules` (dotted names on the Python path) without editing the package.
BUILTIN_MODULES = ("vit_jax.data.image_ops", "vit_jax.data.label_ops", "vit_jax.data.randaug",
                   "vit_jax.data.video_ops", "vit_jax.data.erasing", "vit_jax.data.three_augment")


class UnknownOpModule(UserError, ValueError):
    """A module named in data.pp_modules cannot be imported."""


def load_modules(names: tuple[str, ...] | list[str] = ()) -> None:
    """Imports the built-in op modules and then `names` (idempotent: Python imports each module once)."""
    for name in (*BUILTIN_MODULES, *names):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is None or not name.startswith(e.name):
                raise  # the module exists but one of its own imports is missing: that error is the useful one
            raise UnknownOpModule(f"preprocessing op module '{name}' (data.pp_modules) cannot be imported: no "
                                  f"module named '{e.name}' on the Python path") from e


def _load_ops() -> None:
    load_modules()


def _signature(name: str) -> str:
    params = inspect.signature(_REGISTRY[name]).parameters.values()
    return f"{name}({', '.join(str(p.replace(annotation=inspect.Parameter.empty)) for p in params)})"


def known_ops() -> dict[str, str]:
    """Registered op names with their signatures, e.g. {"resize": "resize(h, w=None)"}."""
    _load_ops()
    return {name: _signature(name) for name in sorted(_REGISTRY)}


def _parse_call(text: str) -> tuple[str, list, dict]:
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"cannot parse preprocessing op '{text}': {e.msg}") from e
    if isinstance(node, ast.Name):
        return node.id, [], {}
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise ValueError(f"preprocessing op '{text}' must look like name or name(args...)")
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError as e:
        raise ValueError(f"preprocessing op '{text}': arguments must be literals (numbers, strings, tuples)") from e
    return node.func.id, args, kwargs


def build(pp: str) -> Op:
    """Compiles an op string into one function `fn(example, rng) -> example` applying the ops left to right."""
    _load_ops()
    ops: list[tuple[str, Op]] = []
    for piece in (p for p in pp.split("|") if p.strip()):
        name, args, kwargs = _parse_call(piece)
        if name not in _REGISTRY:
            raise ValueError(f"unknown preprocessing op '{name}' in '{pp}'; known ops: {', '.join(sorted(_REGISTRY))}")
        factory = _REGISTRY[name]
        try:
            inspect.signature(factory).bind(*args, **kwargs)
        except TypeError as e:
            raise ValueError(f"bad arguments in '{piece.strip()}' ({e}); expected {_signature(name)}") from e
        ops.append((piece.strip(), factory(*args, **kwargs)))

    def apply(example: Example, rng: np.random.Generator) -> Example:
        for _, op in ops:
            example = op(example, rng)
        return example

    apply.ops = [text for text, _ in ops]  # for error messages and descriptions
    return apply
