"""`vit-jax plan`: will this training run fit in an accelerator's memory, how fast can it go, and what is the cheapest
fix when it does not fit?

With `--topology` (a TPU slice: `v3:8x8`, `v4:2x2x4`, or an accelerator type: `v3-128`, `v5litepod-16`) and libtpu
installed (`pip install "jax[tpu]"`; the `test` extra has it), the trainer's real train and eval steps are compiled by
the TPU compiler for that slice on this machine, no TPU needed (vit_jax.bench.aot_plan): per-device HBM as the
compiler assigns it, FLOPs, HBM traffic and collectives per mesh axis from the compiled HLO, and a roofline
(lower-bound step time, img/s and MFU ceilings). The run is described by model flags (below) or by a trainer config:

    vit-jax plan --topology v3:8x8 --variant B/16 --batch-size 4096 --mesh 1,128,1 --output out.json
    vit-jax plan --topology v3:8x8 --variant H/14 --batch-size 4096 --suggest
    vit-jax plan --topology v4-32 --config configs/vit_i21k.py:variant=L/16 --config.batch_size=2048

Without libtpu (or without --topology) the plan is an ESTIMATE: the step is compiled by XLA:CPU for N simulated CPU
devices, whose memory analysis of the per-device SPMD program gives the argument, output, aliased (donated) and
temporary bytes. One caveat is measured and corrected for: XLA:CPU computes bfloat16 matmuls in float32 and keeps
their float32 results, so a bf16 step compiled for CPU holds roughly float32-sized activations. The planner therefore
also counts the activations the backward pass saves (at the JAX level, exact in shape and dtype) at fp32 and at the
compute dtype, and reports `estimate` = XLA:CPU peak - (fp32 saved - compute-dtype saved). `fits` is decided on the
criterion chosen with --criterion (default: the XLA:CPU peak, which is conservative for bf16).

    vit-jax plan --variant H/14 --batch-size 4096 --devices 64 --accelerator v3 --suggest
    vit-jax plan --variant g/14 --batch-size 4096 --devices 256 --mesh 2,128,1 --remat full --hbm-gib 32 --output g14.json

--suggest searches, in order of cost, remat none < dots < dots_no_batch (recompute elementwise ops, then attention
matmuls too) < 2 and 4 micro-batches (more parameter all-gathers, same FLOPs) < full remat (+1 forward pass) with 1, 2, 4,
8 micro-batches; within each, the smallest FSDP degree (least communication) that fits. The first that fits is reported.
Each device count and platform needs a fresh JAX, so the work runs in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from vit_jax import cli_args
from vit_jax import hardware
from vit_jax.bench import common
from vit_jax.errors import child_failure, run_reporting

GIB = common.GIB
# The --accelerator names of the CPU-simulated plan: every accelerator of the hardware table with an HBM size.
ACCELERATORS: dict[str, tuple[str, float]] = {
    a.key: (a.key.upper() if not a.is_tpu else f"TPU {a.key} {'core' if a.devices_per_chip > 1 else 'chip'}",
            a.device_hbm_bytes) for a in hardware.ACCELERATORS if a.hbm_bytes and a.key in (
        "v3", "v4", "v5e", "v5p", "a100-40", "a100-80", "h100", "h200")}
SEARCH_ORDER = (("none", 1), ("dots", 1), ("dots_no_batch", 1), ("none", 2), ("dots_no_batch", 2), ("none", 4),
                ("dots_no_batch", 4), ("full", 1), ("full", 2), ("full", 4), ("full", 8))
RESULT_MARK = "PLAN_RESULT_JSON:"
# Arguments that only steer the command, not what is compiled.
COMMAND_ONLY = ("worker", "json", "accelerator", "hbm_gib", "usable", "criterion", "suggest", "timeout", "compiler",
                "compare_attention")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The arguments and the trainer overrides (--config.KEY=VALUE, passed through to the trainer's config)."""
    p = cli_args.ArgumentParser(prog="vit-jax plan", description=__doc__.split("\n\n")[0])
    common.add_model_args(p, batch=4096, steps=0, warmup=0)
    p.set_defaults(scan=None, dtype="bfloat16", mesh=None, remat=None, devices=8, num_classes=0)
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd", "adafactor", "lamb"))
    p.add_argument("--mu-dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--micro-batches", type=int, default=None)
    p.add_argument("--config", default="", help="plan a trainer config (FILE.py[:ARGS], plus --config.KEY=VALUE "
                   "overrides) instead of the model flags")
    p.add_argument("--stage", default="", help="of a multi-stage config (config.stages): plan this stage's run, its "
                   "overrides applied (e.g. configs/demo_ssl.py --stage pretrain)")
    p.add_argument("--topology", default="", help="TPU slice: v3:8x8, v4:2x2x4, v5e:4x4, ... or v3-128, v4-32, "
                   "v5litepod-16, v6e-64; or GPUs: h100:8, h200:2x8 (hosts x GPUs). Sets the devices and their memory")
    p.add_argument("--compiler", default="auto", choices=("auto", "tpu", "gpu", "cpu"),
                   help="auto: the TPU or GPU compiler of --topology when installed (libtpu / the CUDA plugin), else "
                        "XLA:CPU on simulated devices (an estimate)")
    p.add_argument("--accelerator", default="", help="one of " + ", ".join(ACCELERATORS))
    p.add_argument("--hbm-gib", type=float, default=0.0, help="memory per device (instead of --accelerator)")
    p.add_argument("--usable", type=float, default=None,
                   help="fraction of HBM the step may use; default 0.9 for the CPU estimate (runtime reserve, "
                        "fragmentation), 1.0 for the TPU compiler (it assigns buffers statically and itself refuses "
                        "a program that exceeds the HBM it can use), 0.75 for GPUs (JAX's default "
                        "XLA_PYTHON_CLIENT_MEM_FRACTION; raise both together)")
    p.add_argument("--criterion", default="xla", choices=("xla", "estimate"), help="what `fits` is decided on "
                   "(CPU estimate only)")
    p.add_argument("--suggest", action="store_true", help="search remat / micro-batches / FSDP for the cheapest fit")
    p.add_argument("--save-hlo", default="", help="TPU/GPU compiler: write the train step's optimized HLO here")
    p.add_argument("--no-eval", dest="eval", action="store_false",
                   help="TPU/GPU compiler: compile the train step only (the eval step is one more compile)")
    p.add_argument("--compare-attention", type=_attention_list, default=(), metavar="IMPL[,IMPL]",
                   help="also plan the same step with these attention kernels (e.g. xla) and report each one's peak "
                        "memory per device and roofline step time beside --attention's")
    p.add_argument("--timeout", type=float, default=3600, help="seconds for the compile subprocess")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    overrides = [a for a in rest if a.startswith("--config.")]
    if len(overrides) != len(rest):
        p.error(f"unrecognized arguments: {' '.join(a for a in rest if a not in overrides)}")
    if overrides and not args.config:
        p.error("--config.KEY=VALUE overrides need --config FILE.py")
    if args.stage and not args.config:
        p.error("--stage needs --config FILE.py")
    return args, overrides


def _attention_list(text: str) -> tuple[str, ...]:
    from vit_jax.models.config import ATTENTION_IMPLEMENTATIONS

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if bad := [n for n in names if n not in ATTENTION_IMPLEMENTATIONS]:
        raise argparse.ArgumentTypeError(f"{', '.join(bad)}: choose from {', '.join(ATTENTION_IMPLEMENTATIONS)}")
    return names


def hbm_bytes(args: argparse.Namespace, topology: hardware.Topology | None = None) -> tuple[float | None, str]:
    if args.hbm_gib:
        return args.hbm_gib * GIB, f"{args.hbm_gib:g} GiB"
    if args.accelerator:
        key = args.accelerator.lower()
        if key not in ACCELERATORS:
            raise SystemExit(f"unknown --accelerator {args.accelerator!r}; choose one of {', '.join(ACCELERATORS)} "
                             "or give --hbm-gib")
        name, size = ACCELERATORS[key]
        return size, f"{name} ({size / GIB:g} GiB)"
    if topology is not None:
        size = topology.generation.device_hbm_bytes
        return size, f"{topology.accelerator_type} ({size / GIB:g} GiB per device)"
    return None, ""


def resolve_mesh(mesh: str, devices: int) -> tuple[int, int, int]:
    """data,fsdp,tensor with at most one -1 (= the devices left over)."""
    dims = list(common.parse_mesh(mesh))
    known = 1
    for d in dims:
        known *= d if d > 0 else 1
    if dims.count(-1) > 1 or devices % known:
        raise SystemExit(f"--mesh {mesh} does not divide {devices} devices")
    dims = [devices // known if d == -1 else d for d in dims]
    if dims[0] * dims[1] * dims[2] != devices:
        raise SystemExit(f"--mesh {mesh} uses {dims[0] * dims[1] * dims[2]} devices, --devices is {devices}")
    return dims[0], dims[1], dims[2]


def fits(peak_bytes: float, hbm: float, usable: float = 1.0) -> bool:
    """Whether a per-device peak fits in `usable` of `hbm` bytes."""
    return peak_bytes <= usable * hbm


# ---------------------------------------------------------------------------------------------------------------------
# In the worker process (its JAX has the simulated devices).

def saved_activation_bytes(program, per_device_batch: int, dtype: str) -> int | None:
    """Bytes the backward pass keeps from the forward (JAX-level residuals, not counting the parameters themselves),
    for one device's (micro-)batch with the model computing in `dtype`."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    try:
        from jax._src.ad_checkpoint import saved_residuals  # the engine of the public print_saved_residuals
    except ImportError:
        return None
    from vit_jax.models.build import build_model

    model = build_model(program.model_cfg.replace(dtype=dtype))
    h, w = program.model_cfg.image_size

    def loss(params, images):
        return model.apply(params, images, train=True)[0].astype(jnp.float32).sum()

    # Parameters passed in the compute dtype: their casts are then arguments too, and only activations are counted.
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), model.shapes)
    images = jax.ShapeDtypeStruct((per_device_batch, h, w, 3), jnp.float32)
    residuals = saved_residuals(loss, params, images)
    return sum(int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize
               for a, source in residuals if not source.startswith("from the argument"))


def plan_one(spec: dict[str, Any], compile_step: bool = True) -> dict[str, Any]:
    """Memory report of one configuration, compiled by XLA:CPU (needs data*fsdp*tensor devices in this process)."""
    from vit_jax.bench import plan_spec

    program = plan_spec.build(spec)
    batch = int(spec["batch"])
    report: dict[str, Any] = {"compiler": "xla-cpu (simulated devices: an estimate)", "device_kind": "simulated CPU",
                              **plan_spec.describe(program, batch)}
    if not compile_step:
        return report
    t = time.perf_counter()
    compiled = program.compile_train_step(program.batch_spec(batch))
    report["compile_s"] = time.perf_counter() - t
    xla = common.compiled_memory(compiled)
    report["xla"] = xla
    report["temp_bytes"] = xla.get("temp_size_in_bytes")
    report["peak_bytes"] = xla.get("peak_estimate_bytes")
    micro, dtype = report["per_device_batch"] // report["micro_batches"], program.model_cfg.dtype
    saved = saved_activation_bytes(program, micro, dtype)
    saved32 = saved if dtype == "float32" else saved_activation_bytes(program, micro, "float32")
    report["saved_activation_bytes"] = saved
    report["saved_activation_bytes_fp32"] = saved32
    correction = (saved32 - saved) if saved is not None and saved32 is not None else 0
    report["estimate_bytes"] = report["peak_bytes"] - correction if report["peak_bytes"] is not None else None
    return report


def decide(report: dict[str, Any], hbm: float | None, usable: float, criterion: str) -> dict[str, Any]:
    """`fits` of a report against `usable` x `hbm` bytes per device. The CPU estimate decides on its XLA:CPU peak or
    its bf16 estimate (`criterion`); the TPU compiler's report also needs the compile to have succeeded."""
    if hbm is None or report.get("peak_bytes") is None:
        return report
    report["hbm_bytes"] = hbm
    report["usable_bytes"] = usable * hbm
    report["fits_xla"] = fits(report["peak_bytes"], hbm, usable)
    report["fits_estimate"] = fits(report["estimate_bytes"], hbm, usable)
    report["fits"] = report["fits_xla"] if criterion == "xla" else report["fits_estimate"]
    if report.get("compiler") in ("tpu", "gpu"):
        report["fits"] = bool(report["fits_compiler"] and report["fits_xla"])
    return report


def _fsdp_options(devices: int, tensor: int) -> list[int]:
    n = devices // tensor
    return [k for k in (2**i for i in range(n.bit_length())) if n % k == 0]


def search(spec: dict[str, Any], hbm: float, usable: float, criterion: str, plan_fn=None) -> dict[str, Any]:
    """The first configuration in SEARCH_ORDER (with the smallest FSDP degree) that fits; every compile is logged.
    `plan_fn(spec, compile_step)` plans one configuration (default: the CPU estimate's plan_one)."""
    plan_fn = plan_fn or plan_one
    tried: list[dict[str, Any]] = []
    devices, tensor = spec["devices"], resolve_mesh(spec["mesh"], spec["devices"])[2]
    budget = usable * hbm

    def evaluate(remat: str, micro: int, fsdp: int, compile_step: bool = True) -> dict[str, Any]:
        s = dict(spec, remat=remat, micro_batches=micro, mesh=f"{devices // tensor // fsdp},{fsdp},{tensor}")
        r = decide(plan_fn(s, compile_step), hbm, usable, criterion)
        r["spec"] = s
        if compile_step:
            tried.append(r)
            common.log(f"[plan] {_row(r)}")
        return r

    options = _fsdp_options(devices, tensor)
    sizes = {k: evaluate("none", 1, k, compile_step=False) for k in options}  # state depends on the mesh only
    state = {k: r["state_bytes_per_device"] for k, r in sizes.items()}
    params = {k: r["params_bytes_per_device"] for k, r in sizes.items()}
    best = min(options, key=lambda k: (state[k], k))
    for remat, micro in SEARCH_ORDER:
        if spec["batch"] % (devices // tensor * micro):
            continue
        if state[best] > budget:
            continue
        at_best = evaluate(remat, micro, best)
        if not at_best["fits"]:
            continue
        key = "peak_bytes" if criterion == "xla" else "estimate_bytes"
        for k in (k for k in options if k < best):
            # state differs by (params + optimizer state); gradients add another parameter-sized buffer
            guess = at_best[key] + (state[k] - state[best]) + (params[k] - params[best])
            if guess <= budget:
                r = evaluate(remat, micro, k)
                if r["fits"]:
                    return {"choice": r, "tried": tried}
        return {"choice": at_best, "tried": tried}
    return {"choice": None, "tried": tried}


def run_worker(request: dict[str, Any]) -> dict[str, Any]:
    from vit_jax.bench import plan_spec

    spec, hbm = request["spec"], request["hbm"]
    plan_fn = plan_one
    if request["compiler"] in ("tpu", "gpu"):
        from vit_jax.bench import aot_plan

        plan_fn = aot_plan.plan_one
    spec = plan_spec.resolve(spec, spec["devices"])
    if request["suggest"]:
        out = search(dict(spec, eval=False), hbm, request["usable"], request["criterion"], plan_fn)
        if out["choice"] is not None and request["compiler"] != "cpu" and spec.get("eval", True):  # the choice's
            out["choice"] = aot_plan.add_eval_of(out["choice"], dict(out["choice"]["spec"], eval=True))
        return out
    return decide(plan_fn(spec), hbm, request["usable"], request["criterion"])


# ---------------------------------------------------------------------------------------------------------------------
# The command (never imports JAX itself: each device count and platform needs its own process).

def _row(r: dict[str, Any]) -> str:
    fmt = common.fmt_bytes
    mesh = r["mesh"]
    text = (f"{r['model']} b{r['batch']} {r['dtype']} remat={r['remat']} micro={r['micro_batches']} "
            f"mesh=({mesh['data']},{mesh['fsdp']},{mesh['tensor']}): params {fmt(r['params_bytes_per_device'])} "
            f"opt {fmt(r['opt_state_bytes_per_device'])} ")
    if r.get("out_of_memory"):
        text += f"OUT OF MEMORY at compile: {r['out_of_memory']['message']}"
    elif r.get("compiler") in ("tpu", "gpu"):
        text += f"temp {fmt(r['temp_bytes'])} peak {fmt(r['peak_bytes'])}"
    else:
        text += f"temp {fmt(r['temp_bytes'])} peak {fmt(r['peak_bytes'])} est {fmt(r['estimate_bytes'])}"
    if "fits" in r:
        text += f" -> {'fits' if r['fits'] else 'does not fit'} {fmt(r['usable_bytes'])}"
    if r.get("roofline"):
        rf = r["roofline"]
        text += (f"; {r['step_flops'] / 1e15:.3g} PFLOP/step ({r['flops_vs_analytic']:.3f} x analytic), roofline "
                 f"{rf['step_time_lower_bound_s'] * 1e3:.1f} ms/step ({rf['bound_by']}-bound): "
                 f"{rf['roofline_img_per_s']:.0f} img/s, MFU <= {rf['mfu_ceiling']:.2f}; collectives "
                 f"{fmt(r['collective_bytes'])}/device")
    return text


def run_in_subprocess(request: dict[str, Any], devices: int, timeout: float,
                      env_extra: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs the planner's worker in a fresh Python with `devices` simulated CPU devices (and `env_extra`)."""
    env = dict(os.environ)
    # The memory-minimising scheduler (the concurrency-optimised one trades memory for parallelism on CPU).
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_enable_concurrency_optimized_scheduler=false").strip()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "vit_jax.bench.plan", "--devices", str(devices), "--worker", json.dumps(request)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode:  # the worker printed its error (one line for a user error: main runs it under run_reporting)
        print(proc.stdout[-4000:], end="", flush=True)
        raise child_failure(proc.returncode, "the planner worker")
    if not lines:
        raise RuntimeError(f"planner worker ended without a result; its output:\n{proc.stdout[-4000:]}")
    return json.loads(lines[-1][len(RESULT_MARK):])


def choose_compiler(args: argparse.Namespace, topology: hardware.Topology | None) -> str:
    """'tpu' / 'gpu' (the real compiler for --topology, when installed) or 'cpu' (the simulated-devices estimate)."""
    from vit_jax.bench.aot_plan import INSTALL, compiler_available, compiler_of

    if topology is None or args.compiler == "cpu":
        if args.compiler not in ("auto", "cpu"):
            raise SystemExit(f"--compiler {args.compiler} needs --topology (a TPU slice such as v3:8x8, or GPUs: h100:8)")
        return "cpu"
    wanted = compiler_of(topology)
    if args.compiler not in ("auto", wanted):
        raise SystemExit(f"--topology {topology.name} is compiled by the {wanted.upper()} compiler, not {args.compiler}")
    if compiler_available(wanted):
        return wanted
    if args.compiler == wanted:
        raise SystemExit(f"--compiler {wanted} needs the {wanted.upper()} compiler here: {INSTALL[wanted]}")
    return "cpu"


def plan(argv: list[str]) -> dict[str, Any]:
    """Runs a plan from command-line arguments and returns its JSON-able result (printed and written by main)."""
    args, overrides = parse_args(argv)
    try:
        topology = hardware.parse_topology(args.topology) if args.topology else None
    except ValueError as e:
        raise SystemExit(f"--topology: {e}") from None
    compiler = choose_compiler(args, topology)
    devices = topology.num_devices if topology else args.devices
    hbm, hbm_name = hbm_bytes(args, topology)
    if args.suggest and hbm is None:
        raise SystemExit("--suggest needs a memory size: --topology, --accelerator NAME or --hbm-gib N")
    usable = args.usable if args.usable is not None else {"tpu": 1.0, "gpu": 0.75}.get(compiler, 0.9)
    spec = {k: v for k, v in vars(args).items() if k not in COMMAND_ONLY}
    spec.update(devices=devices, overrides=overrides, topology=topology.name if topology else "")
    if not args.config:  # model flags: their defaults; a config file keeps its own unless a flag is given
        spec.update(remat=args.remat or "none", micro_batches=args.micro_batches or 1, mesh=args.mesh or "1,-1,1",
                    num_classes=args.num_classes or 1000)
    if spec["mesh"]:
        spec["mesh"] = ",".join(map(str, resolve_mesh(spec["mesh"], devices)))
    request = {"spec": spec, "hbm": hbm, "usable": usable, "criterion": args.criterion, "suggest": args.suggest,
               "compiler": compiler}
    if compiler != "cpu":
        from vit_jax.bench.aot_plan import worker_env

        env = worker_env(topology)
    else:
        from vit_jax.bench.aot_plan import INSTALL, compiler_of

        env = {"JAX_PLATFORMS": "cpu"}
        print(f"[plan] ESTIMATE: XLA:CPU on {devices} simulated CPU devices" + (  # stdout: a note on the result
            f" (the {compiler_of(topology).upper()} compiler is not installed: {INSTALL[compiler_of(topology)]})"
            if topology else ""), flush=True)
    t = time.perf_counter()
    out = run_in_subprocess(request, 1 if compiler != "cpu" else devices, args.timeout, env)
    out.update(command=common.command_line("vit-jax plan", argv), accelerator=hbm_name, criterion=args.criterion,
               usable=usable, wall_s=time.perf_counter() - t)
    if args.suggest:
        choice = out["choice"]
        print(f"suggestion for {hbm_name}: " + (_row(choice) if choice else "nothing in the search space fits"))
    else:
        print(_row(out))
    if args.compare_attention and not args.suggest:
        # The same step (batch, remat, mesh) with each other kernel: one worker each (one compile each).
        base = (out.get("attention") or {}).get("requested", args.attention)  # a config file's own, or the flag's
        rows = {base: out}
        for name in (n for n in args.compare_attention if n not in rows):
            other = dict(spec, attention=name)
            if args.config:  # a config's model keys come from the file and its overrides, not the model flags
                other["overrides"] = [*overrides, f"--config.model.attention={name}"]
            rows[name] = run_in_subprocess(dict(request, spec=other), 1 if compiler != "cpu" else devices,
                                           args.timeout, env)
            print(_row(rows[name]))
        out["attention_comparison"] = {name: _attention_figures(r) for name, r in rows.items()}
        print(_attention_table(out["attention_comparison"], base))
    common.write_json(args.json, out)
    return out


def _attention_figures(r: dict[str, Any]) -> dict[str, Any]:
    roof = r.get("roofline") or {}
    return {"used": (r.get("attention") or {}).get("used"), "compiled_kernel": r.get("attention_kernel"),
            "peak_bytes": r.get("peak_bytes"), "temp_bytes": r.get("temp_bytes"), "fits": r.get("fits"),
            "step_time_lower_bound_s": roof.get("step_time_lower_bound_s"), "bound_by": roof.get("bound_by")}


def _attention_table(rows: dict[str, dict[str, Any]], base: str) -> str:
    lines = ["attention kernels, same step: peak per device, roofline step time"]
    for name, f in rows.items():
        peak, ref = f["peak_bytes"], rows[base]["peak_bytes"]
        delta = f" ({(peak - ref) / ref:+.0%} vs {base})" if name != base and peak and ref else ""
        step = f["step_time_lower_bound_s"]
        lines.append(f"  {name:7s} (used: {f['used']}, compiled: {f['compiled_kernel']}): peak "
                     f"{common.fmt_bytes(peak) if peak is not None else '?'}{delta}, "
                     + (f"{step * 1e3:.1f} ms/step ({f['bound_by']}-bound)" if step else "no roofline"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in argv:
        args, _ = parse_args(argv)
        from vit_jax.runtime import configure_jax

        configure_jax(num_cpu_devices=args.devices, cache_dir="none")

        def work() -> int:
            print(RESULT_MARK + json.dumps(run_worker(json.loads(args.worker)), default=float), flush=True)
            return 0

        return run_reporting(work, "vit-jax plan")  # a user error in here is the worker's one line and exit 2
    plan(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
