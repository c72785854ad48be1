"""`vit-jax plan --topology ...` with the real TPU or GPU compiler, on a machine that has neither.

libtpu (installed by `pip install "jax[tpu]"`, and by this project's `test` extra) contains the TPU compiler, the
CUDA plugin (`pip install "jax[cuda12]"`, the `gpu` extra) the GPU compiler. With JAX computing on the CPU
(JAX_PLATFORMS=cpu: the GPU plugin then never looks for a driver), `jax.experimental.topologies.get_topology_desc`
describes a TPU slice of any generation and shape, or N GPUs from an XLA target description
(vit_jax/resources/gpu_targets). The trainer's own program (`build_program`, as the trainer builds it) is laid out
on those devices, and its train and eval steps are lowered and compiled exactly as they would be on the machines.
Per device the compiler reports its memory (arguments, outputs, donated/aliased, temporaries; TPU buffers are
assigned statically, so a TPU program that compiles fits, and one that does not fails to compile with the amount it
needed), and the optimized HLO gives the step's FLOPs, HBM traffic and collectives (vit_jax.bench.hlo), hence a
roofline (vit_jax.bench.roofline).

Runs in the planner's worker process, which must start with `worker_env(topology)`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from typing import Any

from vit_jax import hardware
from vit_jax.bench import common, hlo, plan_spec
from vit_jax.bench.roofline import roofline

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
INSTALL = {"tpu": 'pip install "jax[tpu]" (or this project\'s test extra)',
           "gpu": 'pip install "jax[cuda12]" (this project\'s gpu extra)'}


def compiler_of(topology: hardware.Topology) -> str:
    return "tpu" if topology.generation.is_tpu else "gpu"


def compiler_available(compiler: str) -> bool:
    """Whether the TPU compiler (libtpu) or the GPU compiler (the CUDA plugin) is installed; nothing is imported."""
    if compiler == "tpu":
        return importlib.util.find_spec("libtpu") is not None
    return any(importlib.util.find_spec(m) is not None for m in ("jax_cuda12_plugin", "jax_cuda13_plugin"))


def worker_env(topology: hardware.Topology) -> dict[str, str]:
    """Environment of a process that compiles for `topology`: JAX on the CPU (a TPU or GPU runtime would look for
    chips that are not there), and libtpu told what it would run on (otherwise it logs 'could not determine TPU
    accelerator type' and asks for a metadata server)."""
    return {"JAX_PLATFORMS": "cpu", **(_libtpu_env(topology) if topology.generation.is_tpu else {})}


def _libtpu_env(topology: hardware.Topology) -> dict[str, str]:
    # ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu otherwise takes /tmp/libtpu_lockfile, and a second compiling process (two
    # plans at once, a test next to a plan) fails with "Internal error when accessing libtpu multi-process lockfile".
    return {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": topology.accelerator_type,
            "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


_DEVICES: dict[str, list] = {}


def topology_devices(topology: hardware.Topology) -> list:
    """The devices of a TPU slice or of N GPUs, as their compiler describes them; no TPU or GPU needed. (libtpu also
    describes multi-slice topologies, but the trainer's mesh lays out the devices of one slice only.)"""
    key = topology.name
    if key not in _DEVICES:
        from jax.experimental import topologies

        if topology.generation.is_tpu:
            for name, value in _libtpu_env(topology).items():  # read when libtpu starts (in this process, if not yet)
                os.environ.setdefault(name, value)
            kw = {}
            if topology.chips < 4:  # smaller than a host (v5e:1x1): libtpu's default host is 2x2x1 chips
                kw["chips_per_host_bounds"] = (*topology.shape, *(1,) * (3 - len(topology.shape)))
            desc = topologies.get_topology_desc(platform="tpu", topology_name=topology.name,
                                                chip_config_name=topology.generation.chip_config, **kw)
        else:
            hosts, gpus = topology.shape
            desc = topologies.get_topology_desc(platform="cuda", topology=f"1x{hosts}x{gpus}",
                                                target_config=hardware.gpu_target_config(topology.generation))
        _DEVICES[key] = list(desc.devices)
    return _DEVICES[key]


def out_of_memory(message: str) -> dict[str, Any] | None:
    """The numbers of a TPU compiler out-of-memory error ('... HLO temporaries (98.23G) exceeds available HBM
    (30.75G)' or 'Used 20.5G of 15.48G hbm'); None when the error is something else."""
    if "RESOURCE_EXHAUSTED" not in message and "Ran out of memory" not in message:
        return None
    sizes = [float(v) * _UNITS[u] for v, u in re.findall(r"(\d+(?:\.\d+)?)([KMGT]?)(?:i?B)?\b", message.split(
        "memory", 1)[-1]) if u]
    out: dict[str, Any] = {"message": message.strip().splitlines()[0][:500]}
    m = re.search(r"temporaries \((\d+(?:\.\d+)?)([KMGT])\).*?available HBM \((\d+(?:\.\d+)?)([KMGT])\)", message)
    if m:
        out["temp_bytes"] = float(m.group(1)) * _UNITS[m.group(2)]
        out["available_bytes"] = float(m.group(3)) * _UNITS[m.group(4)]
    elif len(sizes) >= 2:
        out["required_bytes"], out["available_bytes"] = sizes[0], sizes[1]
    return out


def _compile(lowered_fn) -> tuple[Any, float, dict[str, Any] | None]:
    t = time.perf_counter()
    try:
        return lowered_fn().compile(), time.perf_counter() - t, None
    except Exception as e:  # noqa: BLE001 - the compiler's OOM is a JaxRuntimeError; anything else is re-raised
        oom = out_of_memory(str(e))
        if oom is None:
            raise
        return None, time.perf_counter() - t, oom


def plan_one(spec: dict[str, Any], compile_step: bool = True) -> dict[str, Any]:
    """Memory, FLOPs, roofline and collectives of the train step (and the eval step) of a resolved spec, compiled by
    the TPU or GPU compiler for spec['topology']; with compile_step=False only the state sizes (for the search)."""
    topology = hardware.parse_topology(spec["topology"])
    acc = topology.generation
    devices = topology_devices(topology)
    program = plan_spec.build(spec, devices)
    state = program.abstract_state
    mesh = dict(program.mesh.shape)
    batch = int(spec["batch"])
    report: dict[str, Any] = {
        "compiler": compiler_of(topology), "topology": topology.name, "accelerator_type": topology.accelerator_type,
        "device_kind": devices[0].device_kind, "hbm_per_device_bytes": acc.device_hbm_bytes,
        **plan_spec.describe(program, batch)}
    if not compile_step:
        return report
    compiled, report["compile_s"], oom = _compile(lambda: program.train_step.lower(state, program.batch_spec(batch)))
    if oom is not None:
        # The compiler stops at the first buffer it cannot place: what it needed is at least its temporaries plus
        # the state and batch it holds throughout.
        need = oom.get("required_bytes") or oom.get("temp_bytes", float("inf")) + report["state_bytes_per_device"]
        report.update(out_of_memory=oom, fits_compiler=False, peak_bytes=need, estimate_bytes=need, temp_bytes=None)
        return report
    mem = common.compiled_memory(compiled)
    report.update(xla=mem, temp_bytes=mem.get("temp_size_in_bytes"), peak_bytes=mem.get("peak_estimate_bytes"),
                  fits_compiler=True)
    report["estimate_bytes"] = report["peak_bytes"]  # the compiler's own buffer assignment: nothing to estimate
    t = time.perf_counter()
    text = compiled.as_text()
    if spec.get("save_hlo"):
        with open(spec["save_hlo"], "w") as f:
            f.write(text)
    counts = hlo.analyze(text, mesh)
    report["attention_kernel"] = common.attention_kernel(text)
    report["hlo_analysis_s"] = time.perf_counter() - t
    model_flops = program.flops_per_image * batch
    report.update(step_flops=counts["flops"] * len(devices), step_flops_per_device=counts["flops"],
                  analytic_flops=model_flops, flops_vs_analytic=counts["flops"] * len(devices) / model_flops,
                  hbm_traffic_bytes_per_device=counts["hbm_bytes"], unknown_loops=counts["unknown_loops"],
                  collectives=counts["collectives"], collective_bytes=counts["collectives"]["bytes"],
                  xla_cost_analysis=_cost_analysis(compiled))
    roofline_flops = counts["flops"]
    if report["attention_kernel"] == "splash":
        # The Mosaic kernels' FLOPs are not in the HLO's count; the analytic count, which has the attention's, stands
        # in for the step's (flops_vs_analytic keeps what the HLO shows).
        roofline_flops = max(roofline_flops, model_flops / len(devices))
        report["roofline_flops_source"] = "analytic (splash attention's kernels are opaque to the HLO count)"
    report["roofline"] = roofline(acc, num_devices=len(devices), batch=batch, step_flops=roofline_flops,
                                  model_flops=model_flops, hbm_bytes=counts["hbm_bytes"],
                                  ici_bytes=counts["collectives"]["traffic"])
    report["roofline_img_per_s"] = report["roofline"]["roofline_img_per_s"]
    report["mfu_ceiling"] = report["roofline"]["mfu_ceiling"]
    if spec.get("eval", True):
        add_eval(report, program, spec)
    return report


def add_eval(report: dict[str, Any], program, spec: dict[str, Any]) -> None:
    """Compiles the eval step too (for the search's choice only: it is one more compile per configuration)."""
    report["eval"] = eval_step_report(program, spec)
    if report["eval"].get("out_of_memory"):
        report["fits_compiler"] = False
        if "fits" in report:  # decided already (the search's choice)
            report["fits"] = False


def add_eval_of(report: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """add_eval for a report whose program is gone (rebuilt from its spec; building compiles nothing)."""
    topology = hardware.parse_topology(spec["topology"])
    add_eval(report, plan_spec.build(spec, topology_devices(topology)), spec)
    return report


def eval_step_report(program, spec: dict[str, Any]) -> dict[str, Any]:
    """The eval step compiled for the same devices, at the config's eval batch size."""
    eval_batch = int(program.config.eval.batch_size or spec["batch"])
    compiled, seconds, oom = _compile(lambda: program.eval_step.lower(program.abstract_eval_view(),
                                                                      program.eval_batch_spec(eval_batch)))
    out: dict[str, Any] = {"batch": eval_batch, "compile_s": seconds}
    if oom is not None:
        out["out_of_memory"] = oom
    else:
        mem = common.compiled_memory(compiled)
        out.update(xla=mem, peak_bytes=mem.get("peak_estimate_bytes"))
    return out


def _cost_analysis(compiled) -> dict[str, float]:
    """XLA's own counts, for reference (they count a loop body once)."""
    try:
        ca = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return {}
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return {k: float(ca[k]) for k in ("flops", "bytes accessed", "optimal_seconds") if k in (ca or {})}
