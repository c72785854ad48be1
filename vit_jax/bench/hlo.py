"""What a compiled XLA module does per step, read from its optimized HLO text: matmul FLOPs, HBM bytes, collectives.

XLA's own `cost_analysis()` counts a `while` body once, however many times it runs; a step with `scan` over layers
(and the collective-matmul loops the SPMD partitioner emits) is therefore undercounted. Here every computation is
weighted by how often it runs: the entry once, a while body by its trip count (XLA's `known_trip_count`, else
`counter < N` read from the loop condition with the counter's start and step read from the loop), fusions and calls
as often as their caller.

- FLOPs: 2 per multiply-accumulate of every `dot` and `convolution` (TPU HLO writes matmuls as convolutions, some
  with padding / dilation tricks: only window positions that land on real input elements count, as in XLA's cost
  model). Elementwise work is not counted, as in the analytic model count (vit_jax.models.flops).
- HBM bytes: operands read plus results written by every top-level instruction (each fusion's inputs and outputs go
  through HBM); a fusion that only slices an operand reads the slice, one that updates a slice in place writes it.
- Collectives: all-gather / reduce-scatter / all-reduce / all-to-all / collective-permute, attributed to the mesh axes
  their replica groups span (vit_jax.bench.hlo_collectives).

Loops whose trip count cannot be read are counted once and listed in `unknown_loops`; nothing is guessed silently.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from typing import Iterator

import numpy as np

from vit_jax.bench.hlo_collectives import collective_record

DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "token": 0}
# Top-level instructions that move no HBM data themselves (bodies they call are counted where they are).
NO_TRAFFIC = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while", "call", "conditional",
              "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain", "iota",
              "async-start", "async-update", "async-done"}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s")
_LINE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_CALLS = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")


@dataclasses.dataclass
class Instruction:
    name: str
    shape: str  # the result type: an array `bf16[8,64]{...}` or a tuple `(f32[], s32[4])`
    opcode: str
    operands: list[str]
    args: str  # the text inside the operand parentheses (a constant's literal)
    attrs: str
    root: bool = False

    @property
    def literal(self) -> float | None:
        if self.opcode != "constant":
            return None
        try:
            return float(self.args)
        except ValueError:
            return None

    def called(self) -> list[tuple[str, str]]:
        """(role, computation) pairs: body / condition / calls / to_apply / branch."""
        out = _CALLS.findall(self.attrs)
        m = re.search(r"branch_computations=\{([^}]*)\}", self.attrs)
        if m:
            out += [("branch", n) for n in re.findall(r"%?([\w.\-]+)", m.group(1))]
        return out


@dataclasses.dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    entry: bool = False

    def __post_init__(self) -> None:
        self.by_name = {i.name: i for i in self.instructions}

    @property
    def root(self) -> Instruction:
        return next((i for i in self.instructions if i.root), self.instructions[-1])

    def source(self, name: str) -> Instruction | None:
        """The instruction behind `name`, looking through copies, bitcasts and converts."""
        inst = self.by_name.get(name)
        while inst is not None and inst.opcode in ("copy", "bitcast", "convert") and inst.operands:
            inst = self.by_name.get(inst.operands[0])
        return inst


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, dims) of every array in a shape text (a tuple gives several)."""
    return [(t, tuple(int(d) for d in dims.split(",") if d)) for t, dims in _ARRAY.findall(shape)]


def shape_bytes(shape: str) -> float:
    return float(sum(DTYPE_BYTES.get(t, 4) * math.prod(dims) for t, dims in arrays(shape)))


def _group_end(text: str, start: int) -> int:
    """Index just past the bracket group that opens at text[start]."""
    pairs, stack = {"(": ")", "{": "}", "[": "]"}, []
    for i in range(start, len(text)):
        if text[i] in pairs:
            stack.append(pairs[text[i]])
        elif stack and text[i] == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
    return len(text)


def parse_instruction(line: str) -> Instruction | None:
    m = _LINE.match(line)
    if not m:
        return None
    rest = m.group(3)
    end = _group_end(rest, 0) if rest.startswith("(") else (rest.find(" ") if " " in rest else len(rest))
    shape, rest = rest[:end], rest[end:].lstrip()
    paren = rest.find("(")
    if paren < 0:
        return None
    close = _group_end(rest, paren)
    args = rest[paren + 1:close - 1]
    return Instruction(m.group(2), shape, rest[:paren].strip(), re.findall(r"%([\w.\-]+)", args), args.strip(),
                       rest[close:], root=bool(m.group(1)))


def parse_module(text: str) -> dict[str, Computation]:
    """The computations of an HLO module text, by name."""
    comps: dict[str, Computation] = {}
    current: tuple[str, bool] | None = None
    body: list[Instruction] = []
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m and line.rstrip().endswith("{") and not line.startswith("HloModule"):
                current, body = (m.group(2), bool(m.group(1))), []
            continue
        if line.rstrip() == "}":  # not "}}, metadata=...": the tail of a custom call's multi-line attributes
            comps[current[0]] = Computation(current[0], body, entry=current[1])
            current = None
        elif (inst := parse_instruction(line)) is not None:
            body.append(inst)
    return comps


# ---------------------------------------------------------------------------------------------------------------------
# How often each computation runs.

def trip_count(module: dict[str, Computation], parent: Computation, loop: Instruction) -> int | None:
    """Iterations of a while loop, or None when they cannot be read."""
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attrs)
    if m:
        return int(m.group(1))
    roles = dict(loop.called())
    cond, body = module.get(roles.get("condition", "")), module.get(roles.get("body", ""))
    if cond is None or body is None or not loop.operands:
        return None
    root = cond.root
    direction = re.search(r"direction=(\w+)", root.attrs)
    if root.opcode != "compare" or len(root.operands) != 2 or direction is None:
        return None
    a, b = (cond.source(o) for o in root.operands)
    op = direction.group(1)
    if a is not None and a.opcode != "get-tuple-element":  # `N > i` is `i < N`
        a, b, op = b, a, {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(op, op)
    index = re.search(r"index=(\d+)", a.attrs) if a is not None and a.opcode == "get-tuple-element" else None
    limit = b.literal if b is not None else None
    if index is None or limit is None:
        return None
    k = int(index.group(1))
    init = parent.source(loop.operands[0])
    start = parent.source(init.operands[k]) if init is not None and init.opcode == "tuple" and k < len(
        init.operands) else None
    update = body.source(body.root.operands[k]) if body.root.opcode == "tuple" and k < len(body.root.operands) else None
    if start is None or start.literal is None or update is None or update.opcode not in ("add", "subtract"):
        return None
    steps = [s.literal for s in (body.source(o) for o in update.operands) if s is not None and s.literal is not None]
    if len(steps) != 1 or not steps[0]:
        return None
    step = steps[0] if update.opcode == "add" else -steps[0]
    span = {"LT": limit - start.literal, "LE": limit - start.literal + step, "GT": start.literal - limit,
            "GE": start.literal - limit - step}.get(op)
    if span is None or (op in ("LT", "LE")) != (step > 0):
        return None
    return max(0, math.ceil(span / abs(step)))


def multiplicities(module: dict[str, Computation]) -> tuple[dict[str, float], list[str]]:
    """How many times each computation runs per execution of the entry, and the loops whose count is unknown."""
    entry = next(c for c in module.values() if c.entry)
    counts: dict[str, float] = defaultdict(float)
    unknown: list[str] = []

    def visit(comp: Computation, times: float) -> None:
        counts[comp.name] += times
        for inst in comp.instructions:
            for role, callee in inst.called():
                if callee not in module or role == "to_apply" and inst.opcode != "call":
                    continue  # reduction lambdas of reduce / all-reduce / scatter: scalar code
                n = 1
                if inst.opcode == "while":
                    trips = trip_count(module, comp, inst)
                    if trips is None:
                        if role == "body":
                            unknown.append(f"{comp.name}/{inst.name}")
                        trips = 1
                    n = trips + (role == "condition")
                visit(module[callee], times * n)

    visit(entry, 1.0)
    return dict(counts), unknown


def _fused_computations(module: dict[str, Computation]) -> set[str]:
    """Computations that run inside a fusion or as a scalar lambda (their instructions are not HBM traffic)."""
    inner = set()
    for comp in module.values():
        for inst in comp.instructions:
            for role, callee in inst.called():
                if role == "to_apply" and inst.opcode != "call" or role == "calls" and inst.opcode == "fusion":
                    inner.add(callee)
    return inner


# ---------------------------------------------------------------------------------------------------------------------
# FLOPs.

def _window(attrs: str) -> dict[str, list[list[int]]]:
    m = re.search(r"window=\{([^}]*)\}", attrs)
    out: dict[str, list[list[int]]] = {}
    for key, value in re.findall(r"(\w+)=([\d_x\-]+)", m.group(1) if m else ""):
        out[key] = [[int(v) for v in part.split("_")] for part in value.split("x")]
    return out


def _valid_pairs(out_size: int, in_size: int, window: int, stride: int, pad_lo: int, lhs_dil: int,
                 rhs_dil: int) -> int:
    """(output position, window position) pairs of one spatial dimension that read a real input element (not
    padding, not a hole of lhs dilation)."""
    o = np.arange(out_size, dtype=np.int64)
    last = (in_size - 1) * lhs_dil
    total = 0
    for k in range(window):
        p = o * stride + k * rhs_dil - pad_lo
        total += int(np.count_nonzero((p >= 0) & (p <= last) & (p % lhs_dil == 0)))
    return total


def conv_flops(comp: Computation, inst: Instruction) -> float:
    """2 x multiply-accumulates of a convolution that touch real input (XLA's cost-model convention)."""
    labels = re.search(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)", inst.attrs)
    lhs, rhs = (comp.by_name.get(o) for o in inst.operands[:2])
    if labels is None or lhs is None or rhs is None:
        return 0.0
    lhs_l, rhs_l, out_l = labels.groups()
    lhs_dims, rhs_dims, out_dims = arrays(lhs.shape)[0][1], arrays(rhs.shape)[0][1], arrays(inst.shape)[0][1]
    w = _window(inst.attrs)
    macs = out_dims[out_l.index("b")] * out_dims[out_l.index("f")] * rhs_dims[rhs_l.index("i")]
    spatial = sorted(c for c in out_l if c.isdigit())
    for j, d in enumerate(spatial):
        size = rhs_dims[rhs_l.index(d)]
        get = lambda key, default: w[key][j] if key in w and j < len(w[key]) else default  # noqa: E731
        macs *= _valid_pairs(out_dims[out_l.index(d)], lhs_dims[lhs_l.index(d)], size, get("stride", [1])[0],
                             get("pad", [0, 0])[0], get("lhs_dilate", [1])[0], get("rhs_dilate", [1])[0])
    return 2.0 * macs


def dot_flops(comp: Computation, inst: Instruction) -> float:
    lhs = comp.by_name.get(inst.operands[0]) if inst.operands else None
    m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", inst.attrs)
    if lhs is None:
        return 0.0
    dims = arrays(lhs.shape)[0][1]
    contracted = math.prod(dims[int(i)] for i in m.group(1).split(",") if i) if m else 1
    return 2.0 * math.prod(arrays(inst.shape)[0][1]) * contracted


# ---------------------------------------------------------------------------------------------------------------------
# HBM traffic.

def _users(comp: Computation) -> dict[str, list[Instruction]]:
    users: dict[str, list[Instruction]] = defaultdict(list)
    for inst in comp.instructions:
        for o in inst.operands:
            users[o].append(inst)
    return users


def _param_read(module: dict[str, Computation], fused: Computation, index: int, full: float) -> float:
    """Bytes a fusion reads of its operand `index`: the slices taken when it only slices it (also through nested
    fusions), nothing when it only updates it in place, else all of it."""
    param = next((p for p in fused.instructions if p.opcode == "parameter" and p.args == str(index)), None)
    uses = _users(fused).get(param.name, []) if param is not None else []
    if not uses:
        return full
    read = 0.0
    for use in uses:
        if use.opcode in ("dynamic-slice", "slice") and use.operands[0] == param.name:
            read += shape_bytes(use.shape)
        elif use.opcode == "dynamic-update-slice" and use.operands[0] == param.name:
            continue
        elif use.opcode == "fusion" and (inner := module.get(dict(use.called()).get("calls", ""))) is not None:
            read += sum(_param_read(module, inner, j, full) for j, o in enumerate(use.operands) if o == param.name)
        else:
            return full
    return min(read, full)


def _fusion_bytes(module: dict[str, Computation], comp: Computation, inst: Instruction) -> float:
    operands = [shape_bytes(comp.by_name[o].shape) if o in comp.by_name else 0.0 for o in inst.operands]
    fused = module.get(dict(inst.called()).get("calls", ""))
    if fused is None:
        return shape_bytes(inst.shape) + sum(operands)
    total = sum(_param_read(module, fused, n, full) for n, full in enumerate(operands))
    roots = [fused.by_name.get(o) for o in fused.root.operands] if fused.root.opcode == "tuple" else [fused.root]
    for r in roots:
        r = fused.source(r.name) if r is not None else None
        if r is not None and r.opcode == "dynamic-update-slice" and len(r.operands) > 1:
            update = fused.by_name.get(r.operands[1])  # written in place: only the update goes to HBM
            total += shape_bytes(update.shape) if update is not None else 0.0
        elif r is not None:
            total += shape_bytes(r.shape)
    return total


def instruction_bytes(module: dict[str, Computation], comp: Computation, inst: Instruction) -> float:
    """HBM bytes one top-level instruction reads and writes."""
    if inst.opcode in NO_TRAFFIC or inst.opcode.endswith("-done") or re.search(
            r'custom_call_target="(ConcatBitcast|AllocateBuffer)"', inst.attrs):
        return 0.0  # (those two custom calls only relabel or reserve memory)
    if inst.opcode in ("copy-start", "slice-start"):  # async: (destination, source, context) / ((source), dest, ..)
        dtype, dims = arrays(inst.shape)[1 if inst.opcode == "slice-start" else 0]
        return 2.0 * DTYPE_BYTES.get(dtype, 4) * math.prod(dims)  # read once, written once
    if inst.opcode == "fusion":
        return _fusion_bytes(module, comp, inst)
    if inst.opcode == "dynamic-update-slice" and len(inst.operands) > 1:
        return 2 * shape_bytes(comp.by_name[inst.operands[1]].shape) if inst.operands[1] in comp.by_name else 0.0
    if inst.opcode in ("dynamic-slice", "slice"):
        return 2 * shape_bytes(inst.shape)
    operands = sum(shape_bytes(comp.by_name[o].shape) for o in inst.operands if o in comp.by_name)
    return operands + shape_bytes(inst.shape)


# ---------------------------------------------------------------------------------------------------------------------
# The whole module.

def _top_level(module: dict[str, Computation]) -> Iterator[tuple[Computation, Instruction]]:
    inner = _fused_computations(module)
    for comp in module.values():
        if comp.name not in inner:
            for inst in comp.instructions:
                yield comp, inst


def analyze(text: str, mesh_shape: dict[str, int]) -> dict:
    """Per-device, per-execution totals of an optimized HLO module (see the module docstring)."""
    module = parse_module(text)
    times, unknown = multiplicities(module)
    flops = 0.0
    for comp in module.values():
        n = times.get(comp.name, 0.0)
        for inst in comp.instructions:
            if inst.opcode == "convolution":
                flops += n * conv_flops(comp, inst)
            elif inst.opcode == "dot":
                flops += n * dot_flops(comp, inst)
    hbm = sum(times.get(c.name, 0.0) * instruction_bytes(module, c, i) for c, i in _top_level(module))
    per_kind: dict[str, dict[str, float]] = defaultdict(lambda: {"bytes": 0.0, "traffic": 0.0, "count": 0})
    per_axis: dict[str, dict[str, float]] = defaultdict(lambda: {"bytes": 0.0, "traffic": 0.0, "count": 0})
    for comp in module.values():
        n = times.get(comp.name, 0.0)
        for inst in comp.instructions:
            rec = collective_record(inst.opcode, [DTYPE_BYTES.get(t, 4) * math.prod(d) for t, d in arrays(inst.shape)],
                                    inst.attrs, mesh_shape) if n else None
            if rec is None:
                continue
            for table, key in ((per_kind, rec["kind"]), (per_axis, rec["axes"])):
                table[key]["bytes"] += n * rec["bytes"]
                table[key]["traffic"] += n * rec["traffic"]
                table[key]["count"] += n
    loops = {c.name: t for c, t in ((module[k], v) for k, v in times.items()) if t > 1}
    return {"flops": flops, "hbm_bytes": hbm, "collectives": {"per_kind": dict(per_kind), "per_axis": dict(per_axis),
            "bytes": sum(v["bytes"] for v in per_kind.values()),
            "traffic": sum(v["traffic"] for v in per_kind.values())},
            "repeated_computations": len(loops), "max_repeat": max(loops.values(), default=1),
            "unknown_loops": unknown}
