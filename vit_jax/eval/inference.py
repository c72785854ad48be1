"""A checkpoint's model (any family) ready for inference: parameters placed on a mesh, as training places them.

The one way `vit-jax eval`, `predict` and `analyze` build a model from (ViTConfig, params): the model, the mesh
(every local device on the data axis by default), the parameter and batch shardings, and the parameters on the
devices. Their jitted functions (eval step, features, logits) come from eval/steps.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from vit_jax.eval.steps import example_shape, features_step, has_views, make_eval_step, over_views
from vit_jax.models.build import ModelConfig, build_model
from vit_jax.models.vit import FunctionalViT
from vit_jax.parallel import mesh as mesh_lib


@dataclasses.dataclass(frozen=True)
class InferenceProgram:
    cfg: ModelConfig
    model: FunctionalViT
    mesh: Mesh
    param_sh: Any
    batch_sh: NamedSharding
    params: Any  # on the devices, sharded by param_sh
    extra: Any = None  # a training objective's extra state (a teacher's weights), on the devices; None: none
    extra_sh: Any = None

    def jit(self, fn: Callable) -> Callable:
        """fn(params, batch_or_images) jitted with this program's shardings."""
        return jax.jit(fn, in_shardings=(self.param_sh, self.batch_sh))

    def view(self) -> Any:
        """What an objective's eval step reads: the parameters, or (params, extra) with extra state."""
        return self.params if self.extra is None else (self.params, self.extra)

    def jit_view(self, fn: Callable) -> Callable:
        """fn(view, batch) jitted with this program's shardings (see `view`)."""
        view_sh = self.param_sh if self.extra is None else (self.param_sh, self.extra_sh)
        return jax.jit(fn, in_shardings=(view_sh, self.batch_sh))

    def eval_step(self, loss_kind: str = "softmax_xent") -> Callable:
        return self.jit(make_eval_step(self.model, loss_kind))

    def features(self) -> Callable:
        return self.jit(features_step(self.model))

    def logits(self) -> Callable:
        """Logits of a batch, or the mean logits of each example's views (eval/steps.py over_views)."""
        model = self.model
        return self.jit(lambda params, images: over_views(lambda x: model.apply(params, x)[0], model.cfg, images))

    def global_batch(self, batch_size: int) -> int:
        return global_batch(self.mesh, batch_size)


def global_batch(mesh: Mesh, batch_size: int) -> int:
    """The batch size rounded down to a multiple of the mesh's device count, at least one example per device."""
    return max(batch_size // mesh.size, 1) * mesh.size


def build_inference(cfg: ModelConfig, params: Any, mesh: Mesh | None = None,
                    model: FunctionalViT | None = None, extra: Any = None,
                    extra_axes: Any = None) -> InferenceProgram:
    """Places `params` (host numpy or device arrays, our layout) on `mesh` (default: all devices, data-parallel).
    `model`: another model of `cfg`'s encoder than the plain one (a training objective's, with its head).
    `extra`: a training objective's extra state, sharded by `extra_axes` (logical axes; None: replicated)."""
    mesh = mesh if mesh is not None else mesh_lib.make_mesh()
    model = model if model is not None else build_model(cfg)
    param_sh = mesh_lib.tree_shardings(model.logical_axes, model.shapes, mesh)
    extra_sh = None
    if extra is not None:
        extra_sh = (mesh_lib.tree_shardings(extra_axes, jax.eval_shape(lambda: extra), mesh) if extra_axes is not None
                    else jax.tree.map(lambda _: mesh_lib.replicated(mesh), extra))
        extra = jax.device_put(extra, extra_sh)
    return InferenceProgram(cfg=cfg, model=model, mesh=mesh, param_sh=param_sh,
                            batch_sh=mesh_lib.batch_sharding(mesh), params=jax.device_put(params, param_sh),
                            extra=extra, extra_sh=extra_sh)


FEATURES = ("logits", "dense", "tokens")


def predict(params, cfg, images: np.ndarray, batch_size: int = 64, features: str = "logits") -> np.ndarray:
    """The model's output on NHWC images (N, H, W, 3), or clips (N, T, H, W, 3) for a video model: logits, or for a
    dense backbone its `dense` or `tokens` feature map. Inputs with a views axis, (N, V, ...) (a clip's multi-view
    evaluation), give each example's mean logits over its views."""
    rank = len(example_shape(cfg)) + 1
    if images.ndim != rank + has_views(cfg, images.ndim) or images.shape[-1] != 3:
        raise ValueError(f"inputs must be {'(N, T, H, W, 3) clips' if rank == 5 else '(N, H, W, 3) images'}"
                         f"{'' if cfg.dense else ' (or (N, views, ...) of them)'}, got {images.shape}")
    if features not in FEATURES:
        raise ValueError(f"features={features!r} is not one of {FEATURES}")
    if (features == "logits") == cfg.dense:
        raise ValueError(features_mismatch(cfg))
    # One device: any batch size, and the chunks are small.
    program = build_inference(cfg, params, mesh_lib.make_mesh(devices=jax.devices()[:1]))
    if cfg.dense:
        model = program.model

        def both_maps(p, x):  # the neck's map and the encoder's tokens
            out, aux = model.apply(p, x)
            return out, aux["tokens"].astype(jnp.float32)
        # One program for both maps (the neck is cheap next to the encoder): `dense` and `tokens` runs of the same
        # model then share one compilation (the persistent cache keys on the program).
        maps, index = program.jit(both_maps), (1 if features == "tokens" else 0)

        def fn(p, x):
            return maps(p, x)[index]
    else:
        fn = program.logits()
    out = []
    for i in range(0, len(images), batch_size):
        chunk = images[i:i + batch_size]
        n = len(chunk)
        if n < batch_size and len(images) > batch_size:  # pad the tail: one compiled shape
            chunk = np.concatenate([chunk, np.zeros((batch_size - n, *chunk.shape[1:]), chunk.dtype)])
        out.append(np.asarray(fn(program.params, chunk))[:n])  # numpy in: placed once, by the jit's sharding
    return np.concatenate(out)


def features_mismatch(cfg) -> str:
    """Why `features` does not fit this model (a classifier has logits; a dense backbone has feature maps)."""
    if cfg.dense:
        return f"{cfg.name} is a dense backbone without classes: use --features dense or tokens (no --top-k)"
    return f"{cfg.name} is a classifier: use --features logits (dense and tokens need a dense backbone)"
