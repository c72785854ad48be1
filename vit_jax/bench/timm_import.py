"""Importing timm (the `--compare timm` peer, and the test suite's numeric oracle) beside a CPU-only PyTorch.

timm imports torchvision. PyPI's torchvision wheels for x86-64 Linux are built against the CUDA build of PyTorch:
beside a CPU build (what the `interop` extra installs, `torch==2.13.0+cpu`) their compiled operators (`torchvision/_C`)
cannot load (libtorch_cuda.so is missing). torchvision then imports its Python code without them, except for two
fake-tensor registrations (`torchvision::nms`, `torchvision::qnms`) that need the operators to exist, and the import
fails with "operator torchvision::nms does not exist". timm's ViTs and ResNets never call those detection operators;
declaring their schemas (no kernel: a call would still fail) lets torchvision, and so timm, import. Where the compiled
operators do load (a matching torchvision build), nothing is declared.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

# torchvision's schemas of the operators its import registers fake kernels for without checking that they loaded.
UNGUARDED_TORCHVISION_OPS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
                             "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_declared = None  # the torch.library.Library holding the declared schemas (it must stay referenced)


def import_timm() -> ModuleType:
    """timm, imported; ImportError where torch, torchvision or timm is not installed."""
    import torch

    _declare_torchvision_ops_if_unloadable(torch)
    import timm

    return timm


def import_transformers() -> ModuleType:
    """transformers (the video tests' ViViT oracle), imported beside a CPU-only PyTorch the same way: its image
    utilities import torchvision too. ImportError where torch or transformers is not installed."""
    import torch

    _declare_torchvision_ops_if_unloadable(torch)
    import transformers

    return transformers


def import_open_clip() -> ModuleType:
    """open_clip (the SigLIP tests' second oracle: its big_vision .npz loader), imported the same way: it imports
    timm and torchvision. ImportError where torch or open_clip is not installed."""
    import torch

    _declare_torchvision_ops_if_unloadable(torch)
    import open_clip

    return open_clip


def _declare_torchvision_ops_if_unloadable(torch) -> None:
    global _declared
    if _declared is not None or "torchvision" in sys.modules:
        return  # declared already, or torchvision imported (successfully) before
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: timm's own import error says so
    folder = list(spec.submodule_search_locations)[0]
    compiled = [os.path.join(folder, "_C" + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    compiled = [path for path in compiled if os.path.exists(path)]
    if not compiled:
        return
    try:
        torch.ops.load_library(compiled[0])  # what torchvision's import does first
        return
    except OSError:
        pass  # a CUDA build of torchvision beside a CPU torch
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in UNGUARDED_TORCHVISION_OPS:
        library.define(schema)
    _declared = library
