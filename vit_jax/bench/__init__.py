"""`vit-jax bench {data,train,eval}`: benchmarks that measure (results recorded in docs/BENCHMARKS.md)."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "data": ("vit_jax.bench.data", "input pipeline images/s per core vs TensorFlow's fused decode-and-crop"),
    "train": ("vit_jax.bench.train", "the trainer's jitted train step: step time, img/s, TFLOP/s, MFU, compile time"),
    "eval": ("vit_jax.bench.eval", "inference throughput"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] not in BENCHMARKS and argv[0] not in ("-h", "--help"):
        print(f"vit-jax bench: error: unknown benchmark '{argv[0]}'; choose one of {', '.join(BENCHMARKS)}",
              file=sys.stderr)
        return 2
    if not argv or argv[0] not in BENCHMARKS:
        print("usage: vit-jax bench {" + ",".join(BENCHMARKS) + "} [ARGS...]\n")
        for name, (_, text) in BENCHMARKS.items():
            print(f"  {name:<6} {text}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    module = BENCHMARKS[argv[0]][0]
    if argv[0] == "data" and "--remote" in argv:  # the bucket stream against local disk: its own arguments
        module, argv = "vit_jax.bench.data_remote", [a for a in argv if a != "--remote"]
    return int(importlib.import_module(module).main(argv[1:]) or 0)
