"""The device mesh and the one table of logical-axis -> mesh-axis rules that decides all sharding.

Mesh axes: `data` (pure data parallelism: parameters replicated), `fsdp` (data parallel with parameters and
optimizer state sharded along their `embed` dimension), `tensor` (Megatron-style: MLP hidden units and attention
heads split). Switching between DP, FSDP and FSDP+TP is a change of `config.mesh` only.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axes. Parameters use embed/mlp/heads/kv/vocab/layers/norm/conv_*; activations use
# batch/seq/act_embed/heads/kv/mlp (see vit_jax.models.layers).
RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "embed": ("fsdp",),
    "mlp": ("tensor",),
    "heads": ("tensor",),
    "vocab": ("tensor",),
    "kv": (), "layers": (), "norm": (), "seq": (), "act_embed": (), "conv_in": (), "conv_out": (),
}


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    if data == -1:
        if n % (fsdp * tensor):
            raise ValueError(f"{n} devices cannot be split into fsdp={fsdp} x tensor={tensor}")
        data = n // (fsdp * tensor)
    if data * fsdp * tensor != n:
        raise ValueError(f"mesh data={data} x fsdp={fsdp} x tensor={tensor} needs {data * fsdp * tensor} devices, "
                         f"there are {n}; set mesh.data=-1 to use all remaining devices")
    auto = (jax.sharding.AxisType.Auto,) * 3  # Explicit axes (the new default) break ordinary FSDP code
    return jax.make_mesh((data, fsdp, tensor), AXES, axis_types=auto, devices=devices)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh) -> P:
    """PartitionSpec for one array: each dimension gets the mesh axes of its logical name that (a) have size > 1,
    (b) are not already used by another dimension, and (c) divide the dimension; otherwise it is replicated."""
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape):
        mesh_axes = []
        if name is not None:
            if name not in RULES:
                raise KeyError(f"no sharding rule for logical axis '{name}'; known: {sorted(RULES)}")
            for ax in RULES[name]:
                if mesh.shape[ax] > 1 and ax not in used:
                    mesh_axes.append(ax)
        while mesh_axes and size % int(np.prod([mesh.shape[a] for a in mesh_axes])):
            mesh_axes.pop()  # not divisible: shard over fewer axes (finally replicate)
        used.update(mesh_axes)
        spec.append(tuple(mesh_axes) if len(mesh_axes) > 1 else (mesh_axes[0] if mesh_axes else None))
    return P(*spec)


def tree_shardings(logical_axes: Any, shapes: Any, mesh: Mesh) -> Any:
    """NamedShardings for a tree of arrays given the matching tree of logical-axis tuples."""
    return jax.tree.map(lambda axes, s: NamedSharding(mesh, logical_to_spec(axes, s.shape, mesh)),
                        logical_axes, shapes, is_leaf=lambda x: isinstance(x, tuple))


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
    """Leading (batch) axis over data x fsdp; replicated over tensor."""
    return NamedSharding(mesh, P(("data", "fsdp"), *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def activation_resolver(mesh: Mesh):
    """For vit_jax.models.sharding_hints: logical activation axes -> NamedSharding on this mesh."""

    def resolve(axes, shape):
        return NamedSharding(mesh, logical_to_spec(axes, shape, mesh))

    return resolve


def shardings_like_params(abstract_tree: Any, params_shardings: Any, params_shapes: Any, mesh: Mesh) -> Any:
    """Shardings for a tree that embeds copies of the parameter tree (optimizer moments): a leaf whose key path
    ends with a parameter's path and has that parameter's shape gets its sharding; everything else is replicated."""
    by_path = {}
    for path, sh in jax.tree_util.tree_flatten_with_path(params_shardings)[0]:
        by_path[_keys(path)] = sh
    shape_by_path = {_keys(p): s.shape for p, s in jax.tree_util.tree_flatten_with_path(params_shapes)[0]}

    def pick(path, leaf):
        keys = _keys(path)
        for n in range(len(keys)):
            suffix = keys[n:]
            if suffix in by_path and tuple(shape_by_path[suffix]) == tuple(leaf.shape):
                return by_path[suffix]
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, abstract_tree)


def _keys(path) -> tuple[str, ...]:
    out = []
    for k in path:
        out.append(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))))
    return tuple(out)
