"""What `bench train`, `bench eval` and `plan` share: arguments -> training config, the throughput arithmetic, the
CPU matmul reference, memory reports of compiled steps, the machine description and JSON output.

MFU convention: achieved FLOP/s (analytic model FLOPs / measured step time, summed over devices) divided by the peak of
the devices used. On accelerators the peak is the published dense bf16 rate per device (metrics.PEAK_FLOPS). On CPU
there is no meaningful published peak, so the reference is a large fp32 matmul (4096^2) measured in the same process,
interleaved with the steps, so that a noisy shared machine slows both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import time
from typing import Any, Callable, Sequence

from vit_jax import cli_args, hardware
from vit_jax.models import attention_cpu
from vit_jax.models.config import ATTENTION_IMPLEMENTATIONS, DTYPES, REMAT_POLICIES
from vit_jax.train.metrics import CPU_REFERENCE_N, MatmulReference, cpu_seconds

GIB = 1024**3


# ---------------------------------------------------------------------------------------------------------------------
# Arguments and the training config they describe.

def add_model_args(parser: argparse.ArgumentParser, *, batch: int, steps: int = 10, warmup: int = 2) -> None:
    p = parser
    p.add_argument("--variant", default="S/16", help="a ViT (Ti/16, S/16, B/16, L/16, H/14, R50+B/16) or a BiT "
                                                     "ResNet (BiT-R50x1, R101x3)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batch-size", dest="batch", type=int, default=batch, help="global batch size")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="compute dtype")
    p.add_argument("--mesh", default="-1,1,1", help="data,fsdp,tensor (-1: all remaining devices)")
    p.add_argument("--remat", default="none", choices=REMAT_POLICIES)
    p.add_argument("--scan", action=argparse.BooleanOptionalAction, default=False, help="scan over layers")
    p.add_argument("--steps", type=int, default=steps, help="timed steps (after warm-up)")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed steps after compilation")
    p.add_argument("--devices", type=int, default=0, help="simulate this many CPU devices (fresh process only)")
    p.add_argument("--width", type=int, default=0, help="override the variant's width (tiny test models)")
    p.add_argument("--depth", type=int, default=0)
    p.add_argument("--mlp-dim", type=int, default=0)
    p.add_argument("--num-heads", dest="heads", type=int, default=0)
    p.add_argument("--patch-size", dest="patch", type=int, default=0)
    p.add_argument("--pool", choices=("token", "gap", "map"), default="token",
                   help="the head's pooling (windowed attention needs gap or map: the grid has no class token)")
    p.add_argument("--window-size", type=int, default=0,
                   help="windowed attention (SAM/ViTDet) in windows of this many patches; 0: every block global")
    p.add_argument("--global-blocks", type=lambda s: tuple(int(x) for x in s.split(",") if x), default=(),
                   help="blocks that stay global with --window-size, e.g. 2,5,8,11 (SAM-B)")
    p.add_argument("--rel-pos", action="store_true", help="decomposed relative position bias in every block")
    p.add_argument("--attention", choices=ATTENTION_IMPLEMENTATIONS, default="auto",
                   help="the attention kernel (model.attention): auto picks splash on TPU from 128 tokens, cuDNN on GPU "
                        "in 16-bit, the package's kernel on CPU in float32 (models/attention_impl.py)")
    p.add_argument("--cpu-attention", choices=("kernel", "xla"), default="kernel",
                   help="CPU float32 attention: vit_jax's kernel (the default) or XLA's own ops, to compare")
    p.add_argument("--compile-cache", action="store_true",
                   help="use the persistent compilation cache (off by default so compile times are real)")
    p.add_argument("--reference-n", type=int, default=CPU_REFERENCE_N,
                   help="CPU only: size of the reference fp32 matmul (the trainer's MFU uses the default)")
    p.add_argument("--compile-only", action="store_true",
                   help="ahead-of-time compile and report compile time and memory; allocate and run nothing")
    p.add_argument("--output", dest="json", type=cli_args.output_path, default="", metavar="PATH",
                   help="write the result here as JSON")


def parse_mesh(text: str) -> tuple[int, int, int]:
    parts = [int(x) for x in text.split(",")]
    if len(parts) != 3:
        raise SystemExit(f"--mesh takes data,fsdp,tensor (e.g. 1,8,1), got {text!r}")
    return parts[0], parts[1], parts[2]


def training_config(args: argparse.Namespace, *, optimizer: str = "adamw", mu_dtype: str = "float32",
                    micro_batches: int = 1):
    """The trainer's own config for these benchmark arguments (validated like any config file)."""
    from vit_jax.models.build import family_for_variant
    from vit_jax.train import config as config_lib

    c = config_lib.default_config()
    m = c.model
    m.variant, m.image_size, m.dtype, m.remat = args.variant, args.image_size, args.dtype, args.remat
    # scan None (the planner's default): scanned where the variant's family has the option (a ResNet has none).
    m.scan = args.scan if args.scan is not None else "scan" in family_for_variant(args.variant).schema
    m.width, m.depth, m.mlp_dim, m.num_heads, m.patch_size = args.width, args.depth, args.mlp_dim, args.heads, args.patch
    m.pool, m.window_size, m.global_blocks, m.rel_pos = (args.pool, args.window_size, tuple(args.global_blocks),
                                                         args.rel_pos)
    if "attention" in family_for_variant(args.variant).schema:  # a ResNet has none
        m.attention = getattr(args, "attention", "auto")
    c.batch_size = args.batch
    c.micro_batches = micro_batches
    c.total_steps = max(1, args.steps + args.warmup)
    c.optimizer.name = optimizer
    c.optimizer.mu_dtype = mu_dtype
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = parse_mesh(args.mesh)
    config_lib.validate(c)
    return c


def mesh_devices(mesh: tuple[int, int, int]) -> list:
    """The first data*fsdp*tensor devices (all of them when a dimension is -1)."""
    import jax

    n = 1
    for d in mesh:
        n *= d
    devices = jax.devices()
    if n > 0:
        if n > len(devices):
            raise SystemExit(f"--mesh {mesh} needs {n} devices; this process has {len(devices)} (--devices N simulates "
                             "N CPU devices)")
        devices = devices[:n]
    return devices


def build(args: argparse.Namespace, **config_kw):
    """The TrainProgram (the trainer's own model, mesh, optimizer and jitted steps) for these arguments."""
    from vit_jax.train import config as config_lib
    from vit_jax.train.program import build_program

    config = training_config(args, **config_kw)
    steps = config.total_steps
    durations = config_lib.Durations(total_steps=steps, warmup_steps=0, steps_per_epoch=float(steps), eval_every=0,
                                      checkpoint_every=0, fewshot_every=0)
    return build_program(config, args.num_classes, durations, devices=mesh_devices(parse_mesh(args.mesh)))


def setup_jax(args: argparse.Namespace) -> None:
    """The trainer's process set-up (runtime.configure_jax: its malloc tuning included, so the step is timed as the
    trainer runs it), without the persistent compilation cache. Simulated devices (--devices) are only possible
    before JAX starts, i.e. when the benchmark is the process's entry point."""
    from vit_jax.runtime import configure_jax

    configure_jax(num_cpu_devices=args.devices or None, cache_dir="none")


@contextlib.contextmanager
def compilation_cache(enabled: bool):
    """The persistent compilation cache on or off for a block (a cache hit would make a compile time meaningless)."""
    import jax
    from jax.experimental.compilation_cache.compilation_cache import reset_cache

    old = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", enabled)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", old)
        if old and not enabled:
            # JAX decides once per process, at its first compile, whether the cache is used: a first compile in this
            # block would leave it off for the rest of the process (seen: a test worker whose first program was
            # compiled here cached nothing afterwards). The reset makes the next compile decide again.
            reset_cache()


# ---------------------------------------------------------------------------------------------------------------------
# Arithmetic.

def throughput(step_time_s: float, batch: int, flops_per_image: float, peak_flops_per_device: float,
               num_devices: int) -> dict[str, float]:
    """Images/s, achieved FLOP/s (total and per device) and MFU of one step of `batch` images."""
    achieved = flops_per_image * batch / step_time_s
    return {
        "step_time_s": step_time_s,
        "images_per_s": batch / step_time_s,
        "flops_per_step": flops_per_image * batch,
        "achieved_tflops_per_s": achieved / 1e12,
        "achieved_tflops_per_s_per_device": achieved / num_devices / 1e12,
        "peak_tflops_per_s_per_device": peak_flops_per_device / 1e12,
        "mfu": achieved / (peak_flops_per_device * num_devices),
    }


def summarize(times: Sequence[float]) -> dict[str, float]:
    s = sorted(times)
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "mean": statistics.fmean(s), "n": len(s)}


def timed_loop(run_step: Callable[[], Any], steps: int, reference: MatmulReference | None,
               peers: Sequence[Any] = ()) -> dict[str, Any]:
    """Times `steps` calls of run_step (which must block until its step is done).

    With a reference, one matmul runs before every step and one after the last, so step i is compared with the mean of
    the two matmuls around it (same contention); the ratio's median is then robust to load changing during the run.
    Each peer (bench/peers.py) runs its own step right after each of ours, so the two see the same load.
    """
    step_wall, step_cpu, step_faults, ref_wall, ref_cpu = [], [], [], [], []
    peer_wall: dict[str, list[float]] = {p.name: [] for p in peers}
    if reference:
        w, c = reference.time()
        ref_wall.append(w), ref_cpu.append(c)
    for _ in range(steps):
        wall, cpu, faults = time.perf_counter(), cpu_seconds(), _minor_faults()
        run_step()
        step_wall.append(time.perf_counter() - wall)
        step_cpu.append(cpu_seconds() - cpu)
        step_faults.append(_minor_faults() - faults)
        for peer in peers:
            wall = time.perf_counter()
            peer.step()
            peer_wall[peer.name].append(time.perf_counter() - wall)
        if reference:
            w, c = reference.time()
            ref_wall.append(w), ref_cpu.append(c)
    out: dict[str, Any] = {"step_times_s": step_wall, "step_cpu_s": step_cpu, "step_minor_faults": step_faults,
                           "peer_times_s": peer_wall}
    if reference:
        out["reference_times_s"] = ref_wall
        out["reference_cpu_s"] = ref_cpu
    return out


def _minor_faults() -> int:
    """This process's minor page faults so far: a step that maps its temporaries afresh faults them in every time."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def comparison_report(loop: dict[str, Any], batch: int, peers: Sequence[Any],
                      unavailable: dict[str, str]) -> dict[str, Any]:
    """Each peer's interleaved timing and our speed relative to it (> 1: vit_jax is faster)."""
    ours = loop["step_times_s"]
    out: dict[str, Any] = {}
    for peer in peers:
        times = loop["peer_times_s"][peer.name]
        paired = [p / s for p, s in zip(times, ours)]  # peer time / our time of the same round
        out[peer.name] = {"available": True, "description": peer.description, "params": peer.params,
                          "process": peer.process,
                          "timing": summarize(times),
                          "step_times_s": times, "images_per_s": batch / statistics.median(times),
                          "speed_ratio": statistics.median(times) / statistics.median(ours),
                          "paired_speed_ratios": paired, "paired_speed_ratio_median": statistics.median(paired)}
        if peer.usage:  # in its own process: what each of its steps cost that process (warm-up steps first)
            out[peer.name]["process_usage_per_step"] = peer.usage
    for name, reason in unavailable.items():
        out[name] = {"available": False, "reason": reason}
    return out


def cpu_reference_report(loop: dict[str, Any], reference: MatmulReference, flops_per_step: float) -> dict[str, Any]:
    """The CPU matmul reference and the step's efficiency against it, three ways (see docs/BENCHMARKS.md)."""
    ref, step = loop["reference_times_s"], loop["step_times_s"]
    pair_ratios = [(flops_per_step / s) / (reference.flops / ((a + b) / 2)) for s, a, b in zip(step, ref, ref[1:])]
    cpu_step = statistics.median(loop["step_cpu_s"])
    cpu_ref = statistics.median(loop["reference_cpu_s"])
    return {
        "matmul_n": reference.n,
        "matmul_tflops_per_s": reference.flops / statistics.median(ref) / 1e12,
        "matmul_tflops_per_s_best": reference.flops / min(ref) / 1e12,
        # median over steps of (step FLOP/s) / (FLOP/s of the matmuls just before and after it)
        "paired_ratio_median": statistics.median(pair_ratios),
        "paired_ratios": pair_ratios,
        # conservative: the median step against the fastest matmul seen (the least disturbed one)
        "ratio_vs_best_matmul": (flops_per_step / statistics.median(step)) / (reference.flops / min(ref)),
        # FLOPs per CPU-second (all threads), step vs matmul: insensitive to time lost to other processes
        "cpu_time_ratio": (flops_per_step / cpu_step) / (reference.flops / cpu_ref) if cpu_step and cpu_ref else None,
    }


# ---------------------------------------------------------------------------------------------------------------------
# Memory.

def tree_bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs/arrays carrying shardings (replicated: the whole)."""
    import jax
    import numpy as np

    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) is not None else leaf.shape
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    return total


def tree_bytes(tree: Any) -> int:
    import jax
    import numpy as np

    return sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def compiled_memory(compiled) -> dict[str, Any]:
    """XLA's memory analysis of a compiled (per-device, SPMD) program, and the peak it implies.

    peak = arguments + outputs - aliased (donated) + temporaries: live buffers at the high-water mark, assuming
    arguments stay alive for the whole program (they do unless donated) and no fragmentation.
    """
    ma = compiled.memory_analysis()
    if ma is None:
        return {"available": False}
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
              "generated_code_size_in_bytes")
    out: dict[str, Any] = {"available": True, **{f: int(getattr(ma, f, 0) or 0) for f in fields}}
    out["peak_estimate_bytes"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"] -
                                  out["alias_size_in_bytes"] + out["temp_size_in_bytes"])
    return out


def device_memory_stats(device=None) -> dict[str, Any] | None:
    """The runtime's own counters (GPU/TPU: bytes_in_use, peak_bytes_in_use, bytes_limit); None on CPU."""
    import jax

    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    if not stats:
        return None
    keep = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "largest_alloc_size", "num_allocs")
    return {k: int(stats[k]) for k in keep if k in stats}


def attention_kernel(hlo_text: str) -> str:
    """Which attention the compiled step uses: cuDNN's fused kernel, Pallas splash on TPU (a Mosaic custom call; the
    step has no other) or vit_jax's CPU kernel (custom calls), or XLA's own ops."""
    if "cudnn$fmha" in hlo_text:
        return "cudnn"
    if "tpu_custom_call" in hlo_text:
        return "splash"
    return "vit_jax_cpu" if attention_cpu.FORWARD_TARGET in hlo_text else "xla"


# ---------------------------------------------------------------------------------------------------------------------
# Environment and output.

def environment() -> dict[str, Any]:
    import jax
    import jaxlib

    def version(mod: str) -> str | None:
        try:
            return __import__(mod).__version__
        except Exception:  # noqa: BLE001 - optional package
            return None

    dev = jax.devices()[0]
    return {
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "process_count": jax.process_count(),
        "cpu": hardware.cpu_model(),
        "cpu_cores": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "flax": version("flax"),
        "optax": version("optax"),
        "numpy": version("numpy"),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cpu_attention_kernel_unavailable": attention_cpu.UNAVAILABLE,
        "hostname": platform.node(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def peak_flops_per_device() -> tuple[float | None, str]:
    """Published dense bf16 peak of this accelerator; None on CPU (measured instead) or an unknown kind."""
    import jax

    from vit_jax.train.metrics import PEAK_FLOPS, table_lookup

    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return None, "cpu"
    peak = table_lookup(PEAK_FLOPS, dev.device_kind)
    return peak, (f"{dev.device_kind} dense bf16 peak" if peak else f"unknown device kind {dev.device_kind!r}")


def write_json(path: str, result: dict[str, Any]) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=_json_default)
        f.write("\n")


def _json_default(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def command_line(prog: str, argv: Sequence[str]) -> str:
    import shlex

    return " ".join([prog, *map(shlex.quote, argv)])


def fmt_bytes(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 1024**2:.1f} MiB"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# The measurement both step benchmarks share.

def measure(kind: str, prog: str, argv: Sequence[str], args: argparse.Namespace, program, lowered_fn: Callable,
            run_step: Callable[[], Any], flops_per_image: float, extra: dict[str, Any] | None = None,
            peers: Sequence[Any] = (), unavailable_peers: dict[str, str] | None = None) -> dict[str, Any]:
    """Compile (timed), warm up, time `args.steps` steps against the right peak, and assemble the JSON result.

    `lowered_fn()` returns the lowered step; `run_step(compiled)` runs one step and blocks until it is done. `peers`
    (bench/peers.py) are warmed up and timed interleaved with our steps; `unavailable_peers` maps the peers asked for
    that cannot run here to the reason.
    """
    import jax

    env = environment()
    xla_attention = attention_cpu.xla_ops() if args.cpu_attention == "xla" else contextlib.nullcontext()
    with compilation_cache(args.compile_cache), xla_attention:
        t = time.perf_counter()
        lowered = lowered_fn()
        lower_s = time.perf_counter() - t
        t = time.perf_counter()
        compiled = lowered.compile()
        compile_s = time.perf_counter() - t
    log(f"[bench {kind}] {program.model_cfg.name}: lowered in {lower_s:.1f}s, compiled in {compile_s:.1f}s")

    if args.compile_only:
        return _compile_only_result(kind, prog, argv, args, program, env, lower_s, compile_s, compiled,
                                    flops_per_image, extra)
    for _ in range(args.warmup):
        run_step(compiled)
        for peer in peers:
            peer.step()
    on_cpu = jax.devices()[0].platform == "cpu"
    reference = MatmulReference(args.reference_n) if on_cpu else None
    loop = timed_loop(lambda: run_step(compiled), args.steps, reference, peers)
    n_dev = program.mesh.size
    median = statistics.median(loop["step_times_s"])
    if on_cpu:
        ref = cpu_reference_report(loop, reference, flops_per_image * args.batch)
        # all simulated CPU devices share the cores the matmul used: the whole machine's peak, split evenly
        peak, source = ref["matmul_tflops_per_s"] * 1e12 / n_dev, f"measured fp32 {reference.n}^2 matmul (same process)"
    else:
        ref = None
        peak, source = peak_flops_per_device()
    result: dict[str, Any] = {
        "benchmark": kind,
        "command": command_line(prog, argv),
        "args": vars(args),
        "model": _model_record(program, flops_per_image),
        "mesh": dict(program.mesh.shape),
        "environment": env,
        "compile": {"lower_s": lower_s, "compile_s": compile_s, "total_s": lower_s + compile_s},
        "timing": {**summarize(loop["step_times_s"]), "step_times_s": loop["step_times_s"],
                   "step_cpu_s": loop["step_cpu_s"], "step_minor_faults": loop["step_minor_faults"]},
        "throughput": throughput(median, args.batch, flops_per_image, peak or float("nan"), n_dev),
        "peak_source": source,
        "cpu_reference": ref,
        "memory": {"xla": compiled_memory(compiled), "device_stats": device_memory_stats()},
        "attention_kernel": attention_kernel(compiled.as_text() or ""),
        **(extra or {}),
    }
    if peers or unavailable_peers:
        result["compare"] = comparison_report(loop, args.batch, peers, unavailable_peers or {})
    write_json(args.json, result)
    tp = result["throughput"]
    line = (f"[bench {kind}] {program.model_cfg.name} batch {args.batch} {args.dtype} mesh {dict(program.mesh.shape)}: "
            f"step {median * 1e3:.1f} ms (median of {args.steps}), {tp['images_per_s']:.1f} img/s, "
            f"{tp['achieved_tflops_per_s']:.3f} TFLOP/s, MFU {tp['mfu']:.3f} vs {source}")
    if ref:
        line += (f"; matmul {ref['matmul_tflops_per_s'] * 1e3:.1f} GFLOP/s, paired ratio {ref['paired_ratio_median']:.3f},"
                 f" vs best matmul {ref['ratio_vs_best_matmul']:.3f}, CPU-time ratio {ref['cpu_time_ratio']:.3f}")
    print(line, flush=True)
    for name, peer in result.get("compare", {}).items():
        if peer["available"]:
            print(f"[bench {kind}] {name} ({peer['description']}; {peer['process']} process): step "
                  f"{peer['timing']['median'] * 1e3:.1f} ms, {peer['images_per_s']:.1f} img/s; vit_jax is "
                  f"{peer['speed_ratio']:.2f}x {name} (paired median {peer['paired_speed_ratio_median']:.2f}x)",
                  flush=True)
        else:
            print(f"[bench {kind}] --compare {name}: not installed here, so not timed: {peer['reason']}", flush=True)
    return result


def _model_record(program, flops_per_image: float) -> dict[str, Any]:
    # seq_len: tokens of a ViT; a BiT ResNet has none (None in the JSON).
    return {"name": program.model_cfg.name, "params": program.model.num_params(), "flops_per_image": flops_per_image,
            "seq_len": getattr(program.model_cfg, "seq_len", None)}


def _compile_only_result(kind, prog, argv, args, program, env, lower_s, compile_s, compiled, flops_per_image,
                         extra) -> dict[str, Any]:
    result = {
        "benchmark": kind, "command": command_line(prog, argv), "args": vars(args), "compile_only": True,
        "model": _model_record(program, flops_per_image),
        "mesh": dict(program.mesh.shape), "environment": env,
        "compile": {"lower_s": lower_s, "compile_s": compile_s, "total_s": lower_s + compile_s},
        "memory": {"xla": compiled_memory(compiled), "device_stats": None},
        **(extra or {}),
    }
    write_json(args.json, result)
    print(f"[bench {kind}] {program.model_cfg.name} batch {args.batch} {args.dtype} scan={args.scan} "
          f"remat={args.remat}: lowered in {lower_s:.1f}s, compiled in {compile_s:.1f}s (not run); peak "
          f"{fmt_bytes(result['memory']['xla'].get('peak_estimate_bytes', 0))} per device", flush=True)
    return result
