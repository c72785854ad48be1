"""The README's main job (`make demo`): configs/demo.py end to end in a fresh process reaches >= 95% test accuracy
and leaves checkpoints, TensorBoard events, metrics, summary.json and the curve plot in its workdir."""

import json
import os
import sys

import pytest

from tests.train.helpers import ROOT, run


@pytest.mark.slow
def test_demo_trains_to_95_percent(tmp_path, digits_data_dir):
    workdir = tmp_path / "demo"
    out = run([sys.executable, "-m", "vit_jax.main", f"--config={ROOT / 'configs' / 'demo.py'}", f"--workdir={workdir}",
               f"--config.data.data_dir={digits_data_dir}"])
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["final"]["eval/top1"] >= 0.95, summary["final"]
    assert summary["final"]["eval/count"] == 360
    assert summary["final"]["fewshot/digits/10shot"] > 0.5
    assert os.listdir(workdir / "checkpoints") and any(f.startswith("events.out") for f in os.listdir(workdir / "tb"))
    assert (workdir / "curves.png").stat().st_size > 10_000
    assert len((workdir / "metrics.jsonl").read_text().splitlines()) >= 10
