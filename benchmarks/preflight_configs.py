"""Every shipped config compiled for the TPU topology its docstring names (the config files' TARGETS), with the TPU
compiler on this CPU-only machine; then the markdown tables of docs/BENCHMARKS.md.

    python benchmarks/preflight_configs.py [OUT_DIR] [--only SUBSTRING] [--force] [--table-only]

OUT_DIR defaults to benchmarks/results/preflight. One `vit-jax plan --topology T --compiler tpu --config FILE:ARGS
--no-eval` per entry (the train step; JSON `preflight_<config>_<args>.json`; an existing JSON is kept unless --force),
run one after another.
Needs libtpu (`pip install -e ".[test]"` or `"jax[tpu]"`). Big compiles take minutes each on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("vit_i21k", "vit_i1k", "finetune", "demo", "vit_mae", "bit_i21k", "vit_mpp", "siglip", "swin_i1k")
GIB = 1024**3
JFT_IMAGES = 303e6  # JFT-300M: 303M images (ViT paper, Sec. 4.1)
# The ViT paper's Table 6 (JFT-300M pretraining) models, and the TPUv3-core-days the paper reports for them (its
# Table 2; it gives no epochs there: 0.68k for L/16 matches the compute of the 7-epoch run, see docs/BENCHMARKS.md).
TABLE6 = (("ViT-B/32", "variant=B/32", 7, None), ("ViT-B/16", "variant=B/16", 7, None),
          ("ViT-L/32", "variant=L/32", 7, None), ("ViT-L/16", "variant=L/16", 7, 680),
          ("ViT-L/16", "variant=L/16", 14, None), ("ViT-H/14", "variant=H/14", 14, 2500),
          ("R50x1+ViT-B/16", "variant=R50+B/16", 7, None))


def entries() -> list[tuple[str, str, str]]:
    """(config name, config args, topology) of every TARGETS entry of the shipped configs."""
    out = []
    for name in CONFIGS:
        spec = importlib.util.spec_from_file_location(f"_cfg_{name}", ROOT / "configs" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out += [(name, arg, topology) for arg, topology in module.TARGETS.items()]
    return out


def json_path(out_dir: Path, name: str, arg: str) -> Path:
    return out_dir / f"preflight_{name}_{re.sub(r'[^A-Za-z0-9]+', '-', arg).strip('-') or 'default'}.json"


def run(out_dir: Path, only: str, force: bool) -> None:
    for name, arg, topology in entries():
        path = json_path(out_dir, name, arg)
        if only not in f"{name}:{arg}" or (path.exists() and not force):
            continue
        config = f"configs/{name}.py" + (f":{arg}" if arg else "")
        # The train step only (the eval step would be one more compile), and no time limit worth the name: on 2
        # busy cores an unrolled ViT-B compile for 128 TPU cores took over an hour.
        cmd = [sys.executable, "-m", "vit_jax.bench.plan", "--topology", topology, "--compiler", "tpu", "--config",
               config, "--no-eval", "--timeout", "86400", "--output", str(path)]
        print(f"[preflight] {config} on {topology}", flush=True)
        t = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
        print(f"  {time.perf_counter() - t:.0f}s: " + (r.stdout.strip() or r.stderr.strip()[-2000:]), flush=True)


def _gib(x) -> str:
    return "-" if x is None else f"{x / GIB:.2f}"


def config_table(out_dir: Path) -> str:
    rows = ["| config | target | devices | mesh d x f x t | batch / device | remat | compile s (train [+ eval]) | "
            "peak HBM / device (GiB) | fits | FLOPs / analytic | bound | roofline img/s | MFU ceiling | "
            "collectives / device (GiB, per axis) |", "|" + " --- |" * 14]
    for name, arg, topology in entries():
        path = json_path(out_dir, name, arg)
        if not path.exists():
            rows.append(f"| {name}:{arg} | {topology} | not run | | | | | | | | | | | |")
            continue
        p = json.loads(path.read_text())
        m = p["mesh"]
        label = f"`{name}" + (f":{arg}" if arg else "") + "`"
        if p.get("out_of_memory"):
            rows.append(f"| {label} | {p['accelerator_type']} | {p['num_devices']} | {m['data']}x{m['fsdp']}x"
                        f"{m['tensor']} | {p['per_device_batch']} | {p['remat']} | {p['compile_s']:.0f} | "
                        f"> {_gib(p['peak_bytes'])} of {_gib(p['hbm_per_device_bytes'])} | **no** (compiler: out "
                        f"of memory) | | | | | |")
            continue
        rf = p["roofline"]
        axes = ", ".join(f"{k} {v['bytes'] / GIB:.2f}" for k, v in sorted(p["collectives"]["per_axis"].items()))
        rows.append(
            f"| {label} | {p['accelerator_type']} | {p['num_devices']} | {m['data']}x{m['fsdp']}x{m['tensor']} | "
            f"{p['per_device_batch']} | {p['remat']} | {p['compile_s']:.0f}"
            f"{' + %.0f' % p['eval']['compile_s'] if 'eval' in p else ''} | "
            f"{_gib(p['peak_bytes'])} of {_gib(p['hbm_per_device_bytes'])} | {'yes' if p['fits'] else '**no**'} | "
            f"{p['flops_vs_analytic']:.3f} | {rf['bound_by']} ({rf['step_time_lower_bound_s'] * 1e3:.0f} ms) | "
            f"{p['roofline_img_per_s']:,.0f} | {p['mfu_ceiling']:.2f} | {axes or 'none'} |")
    return "\n".join(rows)


def table6(out_dir: Path) -> str:
    from vit_jax import hardware
    from vit_jax.bench.roofline import core_days

    rows = ["| Table 6 model | epochs | JFT images | compiled as (target) | roofline img/s per v3 core | "
            "predicted TPUv3-core-days (at the ceiling) | paper TPUv3-core-days |", "|" + " --- |" * 7]
    for model, arg, epochs, paper in TABLE6:
        path = json_path(out_dir, "vit_i21k", arg)
        if not path.exists() or "roofline" not in json.loads(path.read_text()):
            rows.append(f"| {model} | {epochs} | | not compiled | | | {paper or ''} |")
            continue
        p = json.loads(path.read_text())
        per_core = p["roofline_img_per_s"] / p["num_devices"]  # a v3 JAX device is one TensorCore
        images = JFT_IMAGES * epochs
        days = core_days(images, p["roofline_img_per_s"], p["num_devices"], hardware.get("v3"))
        rows.append(f"| {model} | {epochs} | {images / 1e9:.2f}B | `vit_i21k.py:{arg}` ({p['accelerator_type']}) | "
                    f"{per_core:.1f} | {days:,.0f} | "
                    f"{f'{paper:,}' if paper else 'not reported'} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=str(ROOT / "benchmarks" / "results" / "preflight"))
    parser.add_argument("--only", default="", help="run only entries whose 'config:args' contains this")
    parser.add_argument("--force", action="store_true", help="recompile entries that have a JSON already")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        run(out_dir, args.only, args.force)
    print(config_table(out_dir) + "\n\n" + table6(out_dir))


if __name__ == "__main__":
    main()
