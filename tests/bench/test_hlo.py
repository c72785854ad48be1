"""HLO text analysis on hand-written modules: loop trip counts, matmul and convolution FLOPs, HBM bytes of fusions,
and the replica-group syntaxes (explicit, iota, mesh, source-target pairs) attributed to mesh axes."""

import pytest

from vit_jax.bench import hlo, hlo_collectives

MESH = {"data": 2, "fsdp": 4, "tensor": 1}  # partition id = 4 * data + fsdp

MODULE = """HloModule toy, entry_computation_layout={(f32[8,16]{1,0})->f32[8,64]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %x.1 = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %w = f32[16,16]{1,0} constant({...})
  %y.1 = f32[8,16]{1,0} dot(%x.1, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[8,16]{1,0}) tuple(%next, %y.1)
}

%cond (p.1: (s32[], f32[8,16])) -> pred[] {
  %p.1 = (s32[], f32[8,16]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

%fused_slice (p0: f32[10,8], p1: s32[]) -> f32[1,8] {
  %p0 = f32[10,8]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = f32[1,8]{1,0} dynamic-slice(%p0, %p1, %z), dynamic_slice_sizes={1,8}
}

ENTRY %main (a: f32[8,16]) -> f32[8,64] {
  %a = f32[8,16]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,16]{1,0}) tuple(%zero, %a)
  %loop = (s32[], f32[8,16]{1,0}) while(%init), condition=%cond, body=%body
  %out = f32[8,16]{1,0} get-tuple-element(%loop), index=1
  %stack = f32[10,8]{1,0} parameter(1)
  %idx = s32[] parameter(2)
  %f = f32[1,8]{1,0} fusion(%stack, %idx), kind=kLoop, calls=%fused_slice
  %ag = f32[8,64]{1,0} all-gather(%out), channel_id=1, replica_groups=[2,4]<=[8], dimensions={1}
  ROOT %ar = f32[8,64]{1,0} all-reduce(%ag), channel_id=2, replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add
}
"""


def test_a_loop_body_counts_as_often_as_it_runs():
    module = hlo.parse_module(MODULE)
    times, unknown = hlo.multiplicities(module)
    assert unknown == [] and times["body"] == 5 and times["cond"] == 6 and times["main"] == 1
    assert "add" not in times  # a reduction lambda is scalar code, not a computation that runs on tensors
    out = hlo.analyze(MODULE, MESH)
    assert out["flops"] == 5 * 2 * 8 * 16 * 16  # the dot, five times
    # HBM: the dot reads 8x16 + 16x16 and writes 8x16 floats each time; the counter add moves 3 scalars and the loop
    # condition's compare 2 scalars and a predicate (6 times); the fusion reads only the slice it takes of the 10x8
    # stack (plus the index) and writes it; the collectives read and write their tensors.
    dot, counter, compare, fusion = (8 * 16 + 16 * 16 + 8 * 16) * 4, 3 * 4, 2 * 4 + 1, 8 * 4 + 4 + 8 * 4
    collectives = (8 * 16 + 8 * 64) * 4 + 2 * 8 * 64 * 4
    assert out["hbm_bytes"] == 5 * (dot + counter) + 6 * compare + fusion + collectives


def test_collectives_are_attributed_to_the_mesh_axes_their_groups_span():
    out = hlo.analyze(MODULE, MESH)["collectives"]
    # [2,4]<=[8]: {0,1,2,3} {4,5,6,7} -> fsdp; [4,2]<=[2,4]T(1,0): {0,4} {1,5} ... -> data
    assert set(out["per_axis"]) == {"fsdp", "data"}
    gathered = 8 * 64 * 4
    assert out["per_kind"]["all-gather"] == {"bytes": gathered, "traffic": gathered * 3 / 4, "count": 1}
    assert out["per_kind"]["all-reduce"] == {"bytes": gathered, "traffic": 2 * gathered / 2, "count": 1}
    assert out["per_axis"]["fsdp"]["bytes"] == gathered and out["per_axis"]["data"]["bytes"] == gathered


@pytest.mark.parametrize("attrs, groups", [
    ("replica_groups={{0,1},{2,3}}, dimensions={0}", [[0, 1], [2, 3]]),
    ("replica_groups={}, to_apply=%add", [[0, 1, 2, 3]]),
    ("replica_groups=[2,2]<=[2,2]T(1,0), dimensions={1}", [[0, 2], [1, 3]]),
    ("source_target_pairs={{0,2},{2,0},{1,3},{3,1}}, metadata={}", [[0, 2], [2, 0], [1, 3], [3, 1]]),
    # XLA's mesh syntax: devices [0,2,1,3] laid out over a 2x1x2x1 mesh, groups along axis_0 (and the size-1 axis_1)
    ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=2,'axis_3'=1], device_ids=([2,2]T(1,0)) "
     "{'axis_0','axis_1'}, use_global_device_ids=true", [[0, 1], [2, 3]]),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}, use_global_device_ids=true", [[0, 2], [1, 3]]),
    ("replica_groups=somethingnew(0), dims", None),
])
def test_replica_group_syntaxes(attrs, groups):
    assert hlo_collectives.replica_groups(attrs, 4) == groups


def test_group_axes():
    mesh = {"data": 2, "fsdp": 2, "tensor": 2}  # id = 4 * data + 2 * fsdp + tensor
    assert hlo_collectives.group_axes([[0, 1], [2, 3]], mesh) == "tensor"
    assert hlo_collectives.group_axes([[0, 4]], mesh) == "data"
    assert hlo_collectives.group_axes([[0, 2, 4, 6]], mesh) == "data+fsdp"
    assert hlo_collectives.group_axes([[0], [1]], mesh) == "none"
    assert hlo_collectives.group_axes(None, mesh) == "unparsed" and hlo_collectives.group_axes([[0, 9]], mesh) == "unknown"


def conv_module(lhs: str, rhs: str, out: str, window: str, labels: str) -> str:
    return f"""HloModule c

ENTRY %main (l: {lhs}, r: {rhs}) -> {out} {{
  %l = {lhs}{{2,1,0}} parameter(0)
  %r = {rhs}{{2,1,0}} parameter(1)
  ROOT %c = {out}{{2,1,0}} convolution(%l, %r), {window}dim_labels={labels}
}}
"""


def test_convolution_flops_skip_window_positions_in_the_padding():
    # 5 outputs x 3 taps, minus the tap that falls on padding at each end: 13 multiply-accumulates.
    conv = conv_module("f32[1,5,1]", "f32[3,1,1]", "f32[1,5,1]", "window={size=3 pad=1_1}, ", "b0f_0io->b0f")
    assert hlo.analyze(conv, {"data": 1})["flops"] == 2 * 13
    # a (4 x 8) @ (8 x 6) matmul written as a 1x1 convolution, as TPU HLO does
    matmul = conv_module("f32[4,1,8]", "f32[1,8,6]", "f32[4,1,6]", "window={size=1}, ", "b0f_0io->b0f")
    assert hlo.analyze(matmul, {"data": 1})["flops"] == 2 * 4 * 6 * 8


def test_a_loop_without_a_readable_counter_is_reported_not_guessed():
    text = MODULE.replace("ROOT %lt = pred[] compare(%i.1, %n), direction=LT", "ROOT %lt = pred[] custom-call(%i.1)")
    out = hlo.analyze(text, MESH)
    assert out["unknown_loops"] == ["main/loop"] and out["flops"] == 2 * 8 * 16 * 16


def test_a_custom_call_with_multi_line_attributes_does_not_end_its_computation():
    """A Pallas kernel's custom call (splash attention on TPU) carries its metadata over several lines, one of them
    starting with '}}': the loop body around it keeps its root, so the loop's trip count is still read."""
    kernel = ('  %k = f32[8,16]{1,0} custom-call(%x.1), custom_call_target="tpu_custom_call", '
              'frontend_attributes={kernel_metadata={\n"xprof_metadata":"{\\"block_q\\": 128}"\n}}, metadata={}\n')
    module = hlo.parse_module(MODULE.replace("  ROOT %t = (s32[], f32[8,16]{1,0}) tuple(%next, %y.1)",
                                             kernel + "  ROOT %t = (s32[], f32[8,16]{1,0}) tuple(%next, %k)"))
    body = module["body"]
    assert body.root.opcode == "tuple" and [i.name for i in body.instructions][-2:] == ["k", "t"]
    assert "cond" in module  # the computations after it are still found
