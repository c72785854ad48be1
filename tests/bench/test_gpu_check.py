"""benchmarks/gpu_check.sh: its CPU smoke path runs the same flow (bench train -> JSON -> summary) on a tiny model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch.helpers import cache_dir

ROOT = Path(__file__).resolve().parents[2]


def _smoke(out, target: str = "", resume: bool = False):
    env = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "VIT_JAX_CACHE_DIR": cache_dir(),  # the test run's cache
           **({"SMOKE_TARGET_MFU": target} if target else {})}
    flags = ["--cpu-smoke", *(["--resume"] if resume else [])]
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), *flags, str(out)],
                          capture_output=True, text=True, timeout=300, env=env)


def test_gpu_check_cpu_smoke(tmp_path):
    proc = _smoke(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu_check_summary.json").read_text())
    (row,) = summary["results"]
    assert row["ran"] and row["device"] == "cpu" and row["pass"] and summary["all_pass"]
    assert 0 < row["target_mfu"] <= row["mfu"]
    bench = json.loads((tmp_path / "gpu_Ti16.json").read_text())
    assert bench["benchmark"] == "train" and bench["args"]["batch"] == row["batch"] == 4
    assert row["mfu"] == bench["throughput"]["mfu"] > 0
    assert "MFU" in proc.stdout
    # A measurement below its target is reported as such (here: an MFU no machine reaches); --resume judges the
    # measurement already there instead of measuring again.
    (tmp_path / "high").mkdir()
    (tmp_path / "high" / "gpu_Ti16.json").write_text(json.dumps(bench))
    proc = _smoke(tmp_path / "high", target="5.0", resume=True)
    summary = json.loads((tmp_path / "high" / "gpu_check_summary.json").read_text())
    assert not summary["results"][0]["pass"] and not summary["all_pass"]
    assert summary["results"][0]["mfu"] == row["mfu"]  # the kept measurement, not a new one
    assert "below target" in proc.stdout and "already measured" in proc.stderr


def test_gpu_check_without_a_gpu_says_so(tmp_path):
    import jax

    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is visible: the script would run the real benchmark")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env={"PYTHON": sys.executable, "SKIP_INSTALL": "1",
                                                       "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "no GPU" in proc.stderr
