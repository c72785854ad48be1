"""Start-up cost of a vit_jax process with and without libtpu installed, on a host without accelerators.

    python benchmarks/startup_libtpu.py [--rounds 10] [--json PATH]

Each scenario starts a fresh Python that imports JAX and creates its backend (`jax.devices()`), which every vit_jax
command does; the scenarios run interleaved, round after round, so that load from other processes hits all alike.
"Without libtpu" is simulated by making `import libtpu` fail (what JAX does when it is not installed). Reported:
median wall seconds and median CPU seconds (user + system, of the child) per scenario, and stderr lines.

  vit_jax, no libtpu    import vit_jax, jax; jax.devices()   (before this change: the baseline)
  vit_jax, libtpu       the same with libtpu importable      (vit_jax pins JAX to the CPU on this host)
  jax, libtpu           import jax; jax.devices()             (JAX alone, left to probe for a TPU)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK_LIBTPU = "import sys; sys.modules['libtpu'] = None; "
SCENARIOS = {
    "vit_jax, no libtpu": BLOCK_LIBTPU + "import vit_jax, jax; jax.devices()",
    "vit_jax, libtpu": "import vit_jax, jax; jax.devices()",
    "jax, libtpu": "import jax; jax.devices()",
}


def once(code: str) -> tuple[float, float, int]:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS" and not k.startswith("TPU_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, len([line for line in r.stderr.splitlines() if line.strip()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        raise SystemExit("libtpu is not installed here: pip install -e '.[test]' (or put it on PYTHONPATH)")
    results = {name: {"wall_s": [], "cpu_s": [], "stderr_lines": []} for name in SCENARIOS}
    for name, code in SCENARIOS.items():  # one untimed start each: the first load of libtpu reads 684 MB from disk
        once(code)
    for _ in range(args.rounds):
        for name, code in SCENARIOS.items():
            wall, cpu, lines = once(code)
            results[name]["wall_s"].append(wall)
            results[name]["cpu_s"].append(cpu)
            results[name]["stderr_lines"].append(lines)
    print("| scenario | wall s (median) | CPU s (median) | stderr lines |\n| --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {statistics.median(r['wall_s']):.2f} | {statistics.median(r['cpu_s']):.2f} | "
              f"{max(r['stderr_lines'])} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": args.rounds, "load_average_1m": os.getloadavg()[0],
                                               "results": results}, indent=1))


if __name__ == "__main__":
    main()
