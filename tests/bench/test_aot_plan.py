"""`vit-jax plan --topology` with the real TPU compiler (libtpu, installed by the test extra) on this CPU-only host:
a tiny ViT compiled for a TPU v4-8 slice, a known collective program attributed to its mesh axes, and the labelled
CPU estimate when the compiler is absent. (The GPU compiler needs the `gpu` extra, 3 GB of CUDA wheels, which the
tests do not install; benchmarks/gpu_plan.sh runs that path, see docs/BENCHMARKS.md.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax import hardware
from vit_jax.bench import aot_plan, common, hlo, plan

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--variant", "Ti/16", "--image-size", "32", "--patch-size", "8", "--width", "64", "--depth", "2", "--mlp-dim",
        "128",
        "--num-heads", "4", "--num-classes", "10", "--batch-size", "16"]


def test_libtpu_is_installed():
    assert aot_plan.compiler_available("tpu"), 'the test extra installs libtpu: pip install -e ".[test]"'


@pytest.mark.slow
def test_plan_compiles_a_tiny_vit_for_a_v4_slice(tmp_path):
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "vit_jax.bench.plan", "--topology", "v4:2x2x1", *TINY, "--mesh", "1,2,2",
                        "--output", str(out)], cwd=ROOT, text=True, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TPU" not in r.stderr.replace("TPU v4", "")  # libtpu told what it runs on: no accelerator-type warnings
    p = json.loads(out.read_text())
    assert (p["compiler"], p["device_kind"], p["num_devices"], p["accelerator_type"]) == ("tpu", "TPU v4", 4, "v4-8")
    assert p["hbm_per_device_bytes"] == 32 * 1024**3 and p["fits"] is True and p["unknown_loops"] == []
    assert p["mesh"] == {"data": 1, "fsdp": 2, "tensor": 2} and p["per_device_batch"] == 8
    xla = p["xla"]
    assert p["peak_bytes"] == xla["argument_size_in_bytes"] + xla["output_size_in_bytes"] - \
        xla["alias_size_in_bytes"] + xla["temp_size_in_bytes"]
    # the donated train state is aliased (TPU layouts pad small arrays to (8, 128) tiles: at least its bytes)
    assert xla["alias_size_in_bytes"] >= p["state_bytes_per_device"]
    # FLOPs counted in the compiled TPU program (both scanned layers) against the analytic 3 x forward count
    assert p["step_flops"] == pytest.approx(p["analytic_flops"], rel=0.02)
    assert p["step_flops_per_device"] * 4 == p["step_flops"]
    assert p["xla_cost_analysis"]["flops"] < p["step_flops_per_device"]  # XLA's own count sees one layer of two
    rf = p["roofline"]
    assert rf["step_time_lower_bound_s"] == max(rf["compute_s"], rf["hbm_s"], rf["ici_s"]) > 0
    assert p["roofline_img_per_s"] == pytest.approx(16 / rf["step_time_lower_bound_s"])
    assert p["mfu_ceiling"] == pytest.approx(p["analytic_flops"] / (4 * 275e12 * rf["step_time_lower_bound_s"]))
    # parameters and optimizer state sharded over fsdp, heads and MLP over tensor: both axes move data
    assert p["collective_bytes"] > 0 and {"fsdp", "tensor"} <= set(p["collectives"]["per_axis"])
    assert set(p["collectives"]["per_axis"]) <= {"fsdp", "tensor", "fsdp+tensor"}
    assert p["eval"]["peak_bytes"] > 0 and p["eval"]["batch"] == 16


@pytest.mark.slow
def test_plan_compiles_a_bit_resnet_for_a_v4_slice(tmp_path):
    """A BiT ResNet has no layers to scan: the planner leaves scan off for it (was: a config error, and with
    configs/bit_i21k.py an AttributeError)."""
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "vit_jax.bench.plan", "--topology", "v4:2x2x1", "--variant", "BiT-R1-1x1",
                        "--image-size", "32", "--num-classes", "10", "--batch-size", "8", "--mesh", "4,1,1", "--no-eval",
                        "--output", str(out)], cwd=ROOT, text=True, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    p = json.loads(out.read_text())
    assert (p["compiler"], p["model"], p["scan"], p["fits"]) == ("tpu", "BiT-R1-1x1", False, True)
    # the compiled step's FLOPs: the analytic 3 x forward less the image gradient, which nobody computes (at 32 px
    # the stem's share is large)
    assert 0.8 * p["analytic_flops"] < p["step_flops"] < p["analytic_flops"]


def test_collectives_of_a_known_program_on_a_data_fsdp_tensor_mesh():
    devices = aot_plan.topology_devices(hardware.parse_topology("v4:2x2x2"))
    assert len(devices) == 8 and devices[0].device_kind == "TPU v4"
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)

    def f(x):  # each collective over one mesh axis, on a per-device (8, 32, 32) float32 block (32 KiB)
        return (jax.lax.psum(x, "data"), jax.lax.all_gather(x, "fsdp", axis=1, tiled=True),
                jax.lax.psum_scatter(x, "tensor", scatter_dimension=2, tiled=True))

    spec = P("data", "fsdp", "tensor")
    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=spec, check_vma=False,
                              out_specs=(P(None, "fsdp", "tensor"), P("data", None, "tensor"), spec)))
    x = jax.ShapeDtypeStruct((16, 64, 64), jnp.float32, sharding=NamedSharding(mesh, spec))
    with common.compilation_cache(False):  # this process caches CPU programs; a TPU one cannot be cached with them
        text = g.lower(x).compile().as_text()
    out = hlo.analyze(text, dict(mesh.shape))["collectives"]
    block = 8 * 32 * 32 * 4
    assert out["per_axis"] == {
        "data": {"bytes": block, "traffic": 2 * block / 2, "count": 1},  # all-reduce of 2: send and receive half
        "fsdp": {"bytes": 2 * block, "traffic": 2 * block / 2, "count": 1},  # all-gather into 2 blocks
        "tensor": {"bytes": block, "traffic": block / 2, "count": 1}}  # reduce-scatter of a block
    assert set(out["per_kind"]) == {"all-reduce", "all-gather", "reduce-scatter"}


FIRST_COMPILE_UNCACHED = """
import os, sys
import jax, jax.numpy as jnp
from vit_jax.runtime import configure_jax
configure_jax(cache_dir=sys.argv[1])
from vit_jax.bench import common
with common.compilation_cache(False):
    jax.jit(lambda x: x + 1.0).lower(jnp.ones(3)).compile()  # the process's first compile
inside = len(os.listdir(sys.argv[1]))
jax.jit(lambda x: x * 2.0).lower(jnp.ones(5)).compile()
print(inside, len(os.listdir(sys.argv[1])) - inside)
"""


def test_a_first_compile_with_the_cache_off_leaves_it_on_for_the_next(tmp_path):
    """JAX decides at a process's first compile whether the persistent cache is used; compilation_cache(False) around
    that compile must not turn the cache off for the rest of the process (a fresh process: the decision is global)."""
    r = subprocess.run([sys.executable, "-c", FIRST_COMPILE_UNCACHED, str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-2000:]
    inside, after = map(int, r.stdout.split()[-2:])
    assert inside == 0 and after >= 1, r.stdout


def test_without_libtpu_the_plan_is_a_labelled_cpu_estimate(monkeypatch):
    monkeypatch.setattr(aot_plan, "compiler_available", lambda compiler: False)
    args, _ = plan.parse_args(["--topology", "v4:2x2x1", *TINY, "--dtype", "float32"])
    topology = hardware.parse_topology(args.topology)
    assert plan.choose_compiler(args, topology) == "cpu"
    with pytest.raises(SystemExit, match="needs the TPU compiler here"):
        plan.choose_compiler(plan.parse_args(["--topology", "v4-8", "--compiler", "tpu"])[0], topology)
    with pytest.raises(SystemExit, match="compiled by the TPU compiler, not gpu"):
        plan.choose_compiler(plan.parse_args(["--topology", "v4-8", "--compiler", "gpu"])[0], topology)
    gpus = hardware.parse_topology("h100:8")
    assert plan.choose_compiler(plan.parse_args(["--topology", "h100:8"])[0], gpus) == "cpu"  # no CUDA plugin
    hbm, name = plan.hbm_bytes(args, topology)
    assert hbm == 32 * 1024**3 and name == "v4-8 (32 GiB per device)"
    spec = {k: v for k, v in vars(args).items() if k not in plan.COMMAND_ONLY}
    spec.update(devices=4, topology="", remat="none", micro_batches=1, mesh="1,4,1", overrides=[])
    r = plan.run_worker({"spec": spec, "hbm": hbm, "usable": 0.9, "criterion": "xla", "suggest": False,
                         "compiler": "cpu"})
    assert r["compiler"] == "xla-cpu (simulated devices: an estimate)" and r["num_devices"] == 4
    assert r["fits"] and r["usable_bytes"] == 0.9 * hbm and r["estimate_bytes"] <= r["peak_bytes"]


def test_out_of_memory_messages_of_the_tpu_compiler():
    oom = aot_plan.out_of_memory("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                                 "temporaries (98.23G) exceeds available HBM (30.75G).")
    assert oom["temp_bytes"] == pytest.approx(98.23 * 1024**3) and oom["available_bytes"] == pytest.approx(30.75 * 1024**3)
    assert aot_plan.out_of_memory("INVALID_ARGUMENT: something else") is None


def test_the_tpu_compiler_takes_splash_attention_from_128_tokens():
    """model.attention=auto on a TPU at 257 tokens compiles Pallas splash (a Mosaic custom call); the plan names the
    kernel requested and used, and counts its FLOPs analytically. (The memory it saves shows at scale: the SAM-B and
    L/14 plans in docs/BENCHMARKS.md; at this size the kernel's own buffers outweigh the logits.)"""
    from vit_jax.bench import plan_spec

    args, _ = plan.parse_args(["--topology", "v4:2x2x1", *TINY, "--image-size", "64", "--patch-size", "4",
                               "--num-heads", "2", "--batch-size", "8", "--no-eval", "--compare-attention", "xla"])
    assert args.compare_attention == ("xla",)
    spec = {k: v for k, v in vars(args).items() if k not in plan.COMMAND_ONLY}
    spec.update(devices=4, topology="v4:2x2x1", remat="none", micro_batches=1, mesh="2,2,1", overrides=[])
    with common.compilation_cache(False):
        auto = aot_plan.plan_one(plan_spec.resolve(spec, 4))
    assert auto["attention"] == {"requested": "auto", "used": "splash", "why": "auto: 257x257 tokens >= 128"}
    assert auto["attention_kernel"] == "splash" and "analytic" in auto["roofline_flops_source"]
    assert auto["roofline"]["compute_s"] * auto["roofline"]["peak_flops_per_device"] >= auto["analytic_flops"] / 4
    xla = dict(auto, attention={"requested": "xla", "used": "xla"}, attention_kernel="xla",
               peak_bytes=2 * auto["peak_bytes"])
    table = plan._attention_table({n: plan._attention_figures(r) for n, r in (("auto", auto), ("xla", xla))}, "auto")
    assert "auto    (used: splash, compiled: splash)" in table and "(+100% vs auto)" in table
    with pytest.raises(SystemExit):
        plan.parse_args(["--compare-attention", "flash"])
