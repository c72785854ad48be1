"""benchmarks/gpu_check.sh: its CPU smoke path runs the same flow (bench train -> JSON -> summary) on a tiny model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_cpu_smoke(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--cpu-smoke", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env={"PYTHON": sys.executable,
                                                                             "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu_check_summary.json").read_text())
    (row,) = summary["results"]
    assert row["ran"] and row["device"] == "cpu" and row["pass"] and summary["all_pass"]
    bench = json.loads((tmp_path / "gpu_Ti16.json").read_text())
    assert bench["benchmark"] == "train" and bench["args"]["batch"] == row["batch"] == 4
    assert row["mfu"] == bench["throughput"]["mfu"] > 0
    assert "MFU" in proc.stdout


def test_gpu_check_without_a_gpu_says_so(tmp_path):
    import jax

    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is visible: the script would run the real benchmark")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env={"PYTHON": sys.executable, "SKIP_INSTALL": "1",
                                                       "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "no GPU" in proc.stderr
