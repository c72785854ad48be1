"""Markdown tables of `vit-jax plan` JSON results (as written by benchmarks/plan_pod.sh) for docs/BENCHMARKS.md."""

import glob
import json
import os
import sys

GIB = 1024**3


def gib(x) -> str:
    return "-" if x is None else f"{x / GIB:.2f}"


def mesh(r) -> str:
    m = r["mesh"]
    return f"{m['data']}x{m['fsdp']}x{m['tensor']}"


def row(r, note="") -> str:
    fits = "yes" if r.get("fits") else "no"
    return (f"| {r['model']} | {r['devices']} | {r['per_device_batch']} | {r['remat']} | {r['micro_batches']} | "
            f"{mesh(r)} | {gib(r['params_bytes_per_device'])} | {gib(r['opt_state_bytes_per_device'])} | "
            f"{gib(r['temp_bytes'])} | {gib(r['peak_bytes'])} | {gib(r['estimate_bytes'])} | {fits} | "
            f"{r.get('compile_s', 0):.0f} | {note} |")


def key(r) -> tuple:
    return r["model"], r["devices"], r["remat"], r["micro_batches"], mesh(r)


def main(out_dir: str) -> None:
    print("| model | devices | batch/device | remat | micro | mesh d x f x t | params | opt state | temp | "
          "peak XLA:CPU | bf16 estimate | fits 14.4 GiB | compile s | |")
    print("|" + " --- |" * 14)
    seen = set()  # the same starting point appears in several searches (e.g. the --criterion estimate rerun)
    for path in sorted(glob.glob(os.path.join(out_dir, "plan_*.json"))):
        out = json.load(open(path))
        tag = os.path.basename(path)[5:-5]
        if "tried" not in out:  # a single plan (older JSON nests it under "report")
            print(row(out.get("report", out), f"({tag})"))
            continue
        first = out["tried"][0]
        if key(first) not in seen:
            print(row(first, "no remat, max FSDP"))
            seen.add(key(first))
        choice = out["choice"]
        if choice is not None and choice != first:
            print(row(choice, f"**suggested** ({out['criterion']} criterion, {len(out['tried'])} compiles)"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
