"""The collectives of an optimized HLO module: their replica groups, the mesh axes those span, the bytes they move.

Replica groups come in four syntaxes (explicit `{{0,1},{2,3}}`, iota `[2,2]<=[2,2]T(1,0)`, XLA's mesh syntax
`mesh['axis_0'=2,...] {'axis_0'}`, and a collective-permute's `source_target_pairs`); each becomes lists of partition
ids, i.e. positions in the program's device order, which is the mesh's devices in row-major order, so the mesh axes
along which a group's members differ are the axes the collective runs over. Bytes are the per-device tensor (the
gathered result of an all-gather, the full input of a reduce-scatter), and the traffic a ring algorithm sends per
device: (k-1)/k of it for k devices, twice that for an all-reduce, all of it for a permute.
"""

from __future__ import annotations

import math
import re

import numpy as np

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def replica_groups(attrs: str, num_devices: int) -> list[list[int]] | None:
    """Partition ids of each group of a collective (None: a syntax this parser does not know)."""
    m = re.search(r"source_target_pairs=(\{(?:\{\d+,\d+\},?)*\})", attrs)
    if m:
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", m.group(1))]
    m = re.search(r"replica_groups=\[(\d+),\d+\]<=(\[[\d,]+\](?:T\([\d,]+\))?)", attrs)
    if m:  # iota syntax: iota(prod(dims)) reshaped to dims, transposed, then cut into groups
        dims = re.match(r"\[([\d,]+)\]", m.group(2)).group(1)
        ids = _device_list(m.group(2), math.prod(int(x) for x in dims.split(",")))
        return ids.reshape(int(m.group(1)), -1).tolist()
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(([^()]*(?:\([^()]*\))?)\))?\s*\{([^}]*)\}",
                  attrs)
    if m:  # mesh syntax: the device list laid out row-major over named axes; a group spans the listed axes
        axes = [(name, int(size)) for name, size in re.findall(r"'(\w+)'=(\d+)", m.group(1))]
        names, grouped = [a for a, _ in axes], re.findall(r"'(\w+)'", m.group(3))
        n = math.prod(s for _, s in axes)
        ids = _device_list(m.group(2), n) if m.group(2) else np.arange(n)
        if ids is None or ids.size != n or any(g not in names for g in grouped):
            return None
        ids = ids.reshape([s for _, s in axes])
        order = [i for i, a in enumerate(names) if a not in grouped] + [names.index(g) for g in grouped]
        size = math.prod(axes[names.index(g)][1] for g in grouped)
        return ids.transpose(order).reshape(-1, size).tolist()
    m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", attrs)
    if m:  # explicit: {{0,1},{2,3}}; {} is one group of all devices
        groups = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
        return groups if groups and groups[0] else [list(range(num_devices))]
    return None


def _device_list(text: str, n: int) -> np.ndarray | None:
    """`[2,2]T(1,0)` (iota reshaped and transposed) or `0,2,1,3` (explicit) -> the flat device order."""
    m = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", text.strip())
    if m:
        ids = np.arange(n).reshape([int(x) for x in m.group(1).split(",")])
        return (ids.transpose([int(x) for x in m.group(2).split(",")]) if m.group(2) else ids).reshape(-1)
    if re.fullmatch(r"[\d,\s]+", text):
        return np.array([int(x) for x in text.split(",")])
    return None


def group_axes(groups: list[list[int]] | None, mesh_shape: dict[str, int]) -> str:
    """The mesh axes a collective's groups span: 'fsdp', 'data+fsdp', ... ('none': one-device groups)."""
    if groups is None:
        return "unparsed"
    names, sizes = list(mesh_shape), list(mesh_shape.values())
    n = math.prod(sizes)
    varying: set[str] = set()
    for group in groups:
        if any(i >= n for i in group):
            return "unknown"
        coords = np.array(np.unravel_index(group, sizes)).T
        varying.update(name for j, name in enumerate(names) if len(set(coords[:, j])) > 1)
    return "+".join(a for a in names if a in varying) or "none"


def collective_record(opcode: str, array_bytes: list[float], attrs: str, mesh_shape: dict[str, int]) -> dict | None:
    """Kind, mesh axes, group size, bytes and ring traffic per device of one collective instruction (given the bytes
    of each array of its result type); None for any other instruction."""
    kind = opcode[:-len("-start")] if opcode.endswith("-start") else opcode
    if kind not in COLLECTIVES:
        return None
    if opcode.endswith("-start") and kind in ("all-gather", "collective-permute"):  # (operands, results, context)
        array_bytes = array_bytes[len(array_bytes) // 2:] if kind == "all-gather" else array_bytes[:1]
    groups = replica_groups(attrs, math.prod(mesh_shape.values()))
    k = max((len(g) for g in groups), default=1) if groups else 1
    size = float(sum(array_bytes)) * (k if kind == "reduce-scatter" else 1)  # reduce-scatter: the full input
    if kind == "collective-permute":
        traffic = size
    else:
        traffic = size * (k - 1) / k * (2 if kind == "all-reduce" else 1)
    return {"kind": kind, "axes": group_axes(groups, mesh_shape), "group_size": k, "bytes": size, "traffic": traffic}
