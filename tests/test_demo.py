"""The README's main job (`make demo`): configs/demo.py end to end in a fresh process reaches >= 95% test accuracy
and leaves checkpoints, TensorBoard events, metrics, summary.json and the curve plot in its workdir."""

import json
import os

import pytest

from tests.launch.helpers import ROOT, job_env, trainer


@pytest.mark.slow
def test_demo_trains_to_95_percent(tmp_path, digits_data_dir, start_job):
    workdir = tmp_path / "demo"  # `make demo`'s command
    job = start_job(trainer(f"--config={ROOT / 'configs' / 'demo.py'}", f"--workdir={workdir}",
                            f"--config.data.data_dir={digits_data_dir}"), env=job_env(xla_flags=""))  # as users run it
    assert job.finish(timeout=900) == 0, job.tail()
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["final"]["eval/top1"] >= 0.95, summary["final"]
    assert summary["final"]["eval/count"] == 360
    assert summary["final"]["fewshot/digits/10shot"] > 0.5
    assert os.listdir(workdir / "checkpoints") and any(f.startswith("events.out") for f in os.listdir(workdir / "tb"))
    assert (workdir / "curves.png").stat().st_size > 10_000
    assert len((workdir / "metrics.jsonl").read_text().splitlines()) >= 10
