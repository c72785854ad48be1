"""Plans every shipped training config (each stage of a staged one) for a TPU slice with the TPU compiler, with
the attention kernel its config asks for (auto unless it says otherwise), and prints a markdown table: which kernel
the compiled step uses, peak memory per chip, whether it fits, compile time.

    .venv/bin/python benchmarks/plan_configs.py [--topology v5e:2x2] [--only demo,siglip] [--output DIR]

Each plan is one `vit-jax plan --config F [--stage S] --topology T --no-eval` process (train step only); a plan that
fails is a row with its one-line error, and the script exits 1 if any failed. Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stages_of(config: Path) -> list[str]:
    """The stage names of a staged config, or [""] for a single run."""
    code = ("import sys; from vit_jax.bench.plan_spec import load_trainer_config as L; "
            "c = L(sys.argv[1], []); print(','.join(s[0] for s in c.get('stages') or ()))")
    out = subprocess.run([sys.executable, "-c", code, str(config)], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "config did not load")
    return [s for s in out.stdout.strip().split(",") if s] or [""]


def plan(config: Path, stage: str, topology: str, out_dir: Path) -> dict:
    out = out_dir / f"{config.stem}{'_' + stage if stage else ''}.json"
    cmd = [sys.executable, "-m", "vit_jax.bench.plan", "--config", str(config.relative_to(ROOT)), "--topology",
           topology, "--no-eval", "--output", str(out), *(["--stage", stage] if stage else [])]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode:
        err = [line for line in proc.stderr.splitlines() if "error" in line.lower()] or proc.stderr.splitlines()
        return {"error": (err[-1] if err else f"exit {proc.returncode}"), "wall_s": wall}
    return {**json.loads(out.read_text()), "wall_s": wall}


def row(name: str, r: dict) -> str:
    if "error" in r:
        return f"| {name} | - | - | - | failed: {r['error'][:160]} | {r['wall_s']:.0f} |"
    att = r.get("attention") or {}
    gib = r["peak_bytes"] / 2**30 if r.get("peak_bytes") else float("nan")
    fits = {True: "yes", False: "no"}.get(r.get("fits"), "?")
    return (f"| {name} | {r['model']} b{r['batch']} | {att.get('used', 'n/a')} / {r.get('attention_kernel', '?')} | "
            f"{gib:.2f} GiB | {fits} | {r['wall_s']:.0f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topology", default="v5e:2x2")
    p.add_argument("--only", default="", help="comma-separated config names (default: every configs/*.py)")
    p.add_argument("--output", default="benchmarks/results/plan_configs", help="folder for each plan's JSON")
    args = p.parse_args()
    out_dir = ROOT / args.output
    out_dir.mkdir(parents=True, exist_ok=True)
    only = {x for x in args.only.split(",") if x}
    configs = [c for c in sorted((ROOT / "configs").glob("*.py")) if not only or c.stem in only]
    print(f"| config ({args.topology}) | model, batch | attention used / compiled | peak per chip | fits | wall s |")
    print("|---|---|---|---|---|---|")
    failed = 0
    for config in configs:
        try:
            stages = stages_of(config)
        except RuntimeError as e:
            print(f"| {config.stem} | - | - | - | failed to load: {e} | 0 |", flush=True)
            failed += 1
            continue
        for stage in stages:
            r = plan(config, stage, args.topology, out_dir)
            failed += "error" in r
            print(row(config.stem + (f" --stage {stage}" if stage else ""), r), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
