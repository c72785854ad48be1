"""`vit-jax plan`: will this training run fit in an accelerator's memory, and if not, what is the cheapest fix?

The real train step (`build_program`, as the trainer builds it) is compiled ahead of time, without running, on a mesh
of N simulated CPU devices; XLA's memory analysis of that per-device SPMD program gives the argument, output, aliased
(donated) and temporary bytes. Parameters and optimizer state per device come from their shardings. The simulated
device count is fixed when JAX starts, so the work runs in a fresh subprocess per device count.

One caveat is measured and corrected for: XLA:CPU computes bfloat16 matmuls in float32 and keeps their float32 results,
so a bf16 step compiled for CPU holds roughly float32-sized activations. Accelerators keep them in bf16. The planner
therefore also counts the activations the backward pass saves (at the JAX level, exact in shape and dtype) at fp32 and
at the compute dtype, and reports `estimate` = XLA:CPU peak - (fp32 saved - compute-dtype saved). `fits` is decided on
the criterion chosen with --criterion (default: the XLA:CPU peak, which is conservative for bf16).

    vit-jax plan --variant H/14 --batch 4096 --devices 64 --accelerator v3 --suggest
    vit-jax plan --variant g/14 --batch 4096 --devices 256 --mesh 2,128,1 --remat full --hbm-gib 32 --json g14.json

--suggest searches, in order of cost, remat none < dots < dots_no_batch (recompute elementwise ops, then attention
matmuls too) < 2 and 4 micro-batches (more parameter all-gathers, same FLOPs) < full remat (+1 forward pass) with 1, 2, 4,
8 micro-batches; within each, the smallest FSDP degree (least communication) that fits. The first that fits is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from vit_jax.bench import common

GIB = common.GIB
# HBM per JAX device (TPU v2/v3: a device is one core; v4 and later: one chip).
ACCELERATORS: dict[str, tuple[str, float]] = {
    "v3": ("TPU v3 core", 16 * GIB), "v4": ("TPU v4 chip", 32 * GIB), "v5e": ("TPU v5e chip", 16 * GIB),
    "v5p": ("TPU v5p chip", 95 * GIB), "a100-40": ("A100 40GB", 40 * GIB), "a100-80": ("A100 80GB", 80 * GIB),
    "h100": ("H100 80GB", 80 * GIB), "h200": ("H200 141GB", 141 * GIB),
}
SEARCH_ORDER = (("none", 1), ("dots", 1), ("dots_no_batch", 1), ("none", 2), ("dots_no_batch", 2), ("none", 4),
                ("dots_no_batch", 4), ("full", 1), ("full", 2), ("full", 4), ("full", 8))
RESULT_MARK = "PLAN_RESULT_JSON:"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vit-jax plan", description=__doc__.split("\n\n")[0])
    common.add_model_args(p, batch=4096, steps=0, warmup=0)
    p.set_defaults(scan=True, dtype="bfloat16", mesh="1,-1,1", devices=8)
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd", "adafactor"))
    p.add_argument("--mu-dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--accelerator", default="", help="one of " + ", ".join(ACCELERATORS))
    p.add_argument("--hbm-gib", type=float, default=0.0, help="memory per device (instead of --accelerator)")
    p.add_argument("--usable", type=float, default=0.9,
                   help="fraction of HBM the step may use (runtime reserve, fragmentation); default 0.9")
    p.add_argument("--criterion", default="xla", choices=("xla", "estimate"), help="what `fits` is decided on")
    p.add_argument("--suggest", action="store_true", help="search remat / micro-batches / FSDP for the cheapest fit")
    p.add_argument("--timeout", type=float, default=3600, help="seconds for the compile subprocess")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def hbm_bytes(args: argparse.Namespace) -> tuple[float | None, str]:
    if args.hbm_gib:
        return args.hbm_gib * GIB, f"{args.hbm_gib:g} GiB"
    if args.accelerator:
        key = args.accelerator.lower()
        if key not in ACCELERATORS:
            raise SystemExit(f"unknown --accelerator {args.accelerator!r}; choose one of {', '.join(ACCELERATORS)} "
                             "or give --hbm-gib")
        name, size = ACCELERATORS[key]
        return size, f"{name} ({size / GIB:g} GiB)"
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
    from vit_jax.models.vit import FunctionalViT

    model = FunctionalViT(program.model_cfg.replace(dtype=dtype))
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
    """Memory report of one configuration (needs data*fsdp*tensor devices in this process)."""
    ns = argparse.Namespace(**spec)
    program = common.build(ns, optimizer=ns.optimizer, mu_dtype=ns.mu_dtype, micro_batches=ns.micro_batches)
    state = program.abstract_state
    mesh = dict(program.mesh.shape)
    dp = mesh["data"] * mesh["fsdp"]
    report: dict[str, Any] = {
        "model": program.model_cfg.name, "params": program.model.num_params(), "devices": program.mesh.size,
        "mesh": mesh, "batch": ns.batch, "per_device_batch": ns.batch // dp, "micro_batches": ns.micro_batches,
        "remat": ns.remat, "dtype": ns.dtype, "scan": ns.scan, "optimizer": ns.optimizer, "mu_dtype": ns.mu_dtype,
        "params_bytes_total": common.tree_bytes(state["params"]),
        "params_bytes_per_device": common.tree_bytes_per_device(state["params"]),
        "opt_state_bytes_total": common.tree_bytes(state["opt_state"]),
        "opt_state_bytes_per_device": common.tree_bytes_per_device(state["opt_state"]),
        "batch_bytes_per_device": common.tree_bytes_per_device(program.batch_spec(ns.batch)),
    }
    report["state_bytes_per_device"] = common.tree_bytes_per_device(state)
    if not compile_step:
        return report
    t = time.perf_counter()
    compiled = program.compile_train_step(program.batch_spec(ns.batch))
    report["compile_s"] = time.perf_counter() - t
    xla = common.compiled_memory(compiled)
    report["xla"] = xla
    report["temp_bytes"] = xla.get("temp_size_in_bytes")
    report["peak_bytes"] = xla.get("peak_estimate_bytes")
    micro = ns.batch // dp // ns.micro_batches
    saved = saved_activation_bytes(program, micro, ns.dtype)
    saved32 = saved if ns.dtype == "float32" else saved_activation_bytes(program, micro, "float32")
    report["saved_activation_bytes"] = saved
    report["saved_activation_bytes_fp32"] = saved32
    correction = (saved32 - saved) if saved is not None and saved32 is not None else 0
    report["estimate_bytes"] = report["peak_bytes"] - correction if report["peak_bytes"] is not None else None
    return report


def decide(report: dict[str, Any], hbm: float | None, usable: float, criterion: str) -> dict[str, Any]:
    if hbm is None or report.get("peak_bytes") is None:
        return report
    report["hbm_bytes"] = hbm
    report["usable_bytes"] = usable * hbm
    report["fits_xla"] = fits(report["peak_bytes"], hbm, usable)
    report["fits_estimate"] = fits(report["estimate_bytes"], hbm, usable)
    report["fits"] = report["fits_xla"] if criterion == "xla" else report["fits_estimate"]
    return report


def _fsdp_options(devices: int, tensor: int) -> list[int]:
    n = devices // tensor
    return [k for k in (2**i for i in range(n.bit_length())) if n % k == 0]


def search(spec: dict[str, Any], hbm: float, usable: float, criterion: str) -> dict[str, Any]:
    """The first configuration in SEARCH_ORDER (with the smallest FSDP degree) that fits; every compile is logged."""
    tried: list[dict[str, Any]] = []
    devices, tensor = spec["devices"], resolve_mesh(spec["mesh"], spec["devices"])[2]
    budget = usable * hbm

    def evaluate(remat: str, micro: int, fsdp: int, compile_step: bool = True) -> dict[str, Any]:
        s = dict(spec, remat=remat, micro_batches=micro, mesh=f"{devices // tensor // fsdp},{fsdp},{tensor}")
        r = decide(plan_one(s, compile_step), hbm, usable, criterion)
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
    spec, hbm = request["spec"], request["hbm"]
    if request["suggest"]:
        return search(spec, hbm, request["usable"], request["criterion"])
    return {"report": decide(plan_one(spec), hbm, request["usable"], request["criterion"])}


# ---------------------------------------------------------------------------------------------------------------------
# The command (never imports JAX itself: each device count needs its own process).

def _row(r: dict[str, Any]) -> str:
    fmt = common.fmt_bytes
    mesh = r["mesh"]
    text = (f"{r['model']} b{r['batch']} {r['dtype']} remat={r['remat']} micro={r['micro_batches']} "
            f"mesh=({mesh['data']},{mesh['fsdp']},{mesh['tensor']}): params {fmt(r['params_bytes_per_device'])} "
            f"opt {fmt(r['opt_state_bytes_per_device'])} temp {fmt(r['temp_bytes'])} peak {fmt(r['peak_bytes'])} "
            f"est {fmt(r['estimate_bytes'])}")
    if "fits" in r:
        text += f" -> {'fits' if r['fits'] else 'does not fit'} {fmt(r['usable_bytes'])}"
    return text


def run_in_subprocess(request: dict[str, Any], devices: int, timeout: float) -> dict[str, Any]:
    """Runs the planner's worker in a fresh Python with `devices` simulated CPU devices."""
    env = dict(os.environ)
    # The memory-minimising scheduler (the concurrency-optimised one trades memory for parallelism on CPU).
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_enable_concurrency_optimized_scheduler=false").strip()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    cmd = [sys.executable, "-m", "vit_jax.bench.plan", "--devices", str(devices), "--worker", json.dumps(request)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"planner worker failed (exit {proc.returncode}); its output:\n{proc.stdout[-4000:]}")
    return json.loads(lines[-1][len(RESULT_MARK):])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        from vit_jax.runtime import configure_jax

        configure_jax(num_cpu_devices=args.devices, cache_dir="none")
        print(RESULT_MARK + json.dumps(run_worker(json.loads(args.worker)), default=float), flush=True)
        return 0
    hbm, hbm_name = hbm_bytes(args)
    if args.suggest and hbm is None:
        raise SystemExit("--suggest needs a memory size: --accelerator NAME or --hbm-gib N")
    data, fsdp, tensor = resolve_mesh(args.mesh, args.devices)
    spec = {k: v for k, v in vars(args).items() if k not in ("worker", "json", "accelerator", "hbm_gib", "usable",
                                                               "criterion", "suggest", "timeout")}
    spec["mesh"] = f"{data},{fsdp},{tensor}"
    request = {"spec": spec, "hbm": hbm, "usable": args.usable, "criterion": args.criterion, "suggest": args.suggest}
    t = time.perf_counter()
    out = run_in_subprocess(request, args.devices, args.timeout)
    out.update(command=common.command_line("vit-jax plan", argv), accelerator=hbm_name, criterion=args.criterion,
               usable=args.usable, wall_s=time.perf_counter() - t)
    if args.suggest:
        choice = out["choice"]
        print(f"suggestion for {hbm_name}: " + (_row(choice) if choice else "nothing in the search space fits"))
    else:
        print(_row(out["report"]))
    common.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
