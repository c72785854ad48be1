"""Metric writing across restarts, and the hardware tables behind MFU and TPU-core-days."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from vit_jax.storage.jsonl import read_jsonl
from vit_jax.train import metrics
from vit_jax.train.metrics import PEAK_FLOPS, TPU_CORES, MetricWriter, table_lookup

ROOT = Path(__file__).resolve().parents[2]


def test_a_resumed_run_drops_the_lines_logged_after_its_checkpoint(tmp_path):
    w = MetricWriter(str(tmp_path), enabled=True)
    for step in (10, 20, 30, 40):
        w.write(step, {"train/loss": 1.0 / step})
    w.close()
    # Killed after step 40 with the last checkpoint at 20: the rerun trains 21..40 again.
    w = MetricWriter(str(tmp_path), enabled=True, resume_step=20)
    for step in (30, 40):
        w.write(step, {"train/loss": 2.0 / step})
    w.close()
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in lines] == [10, 20, 30, 40]
    assert lines[2]["train/loss"] == 2.0 / 30  # the resumed segment's value, not the lost one
    assert all(json.dumps(r) for r in lines)


def test_the_cpu_reference_is_shared_by_a_machines_runs_for_an_hour_and_measured_again_otherwise(tmp_path):
    measured = []

    def measure(value):
        return lambda: measured.append(value) or value

    folder = str(tmp_path)
    t0 = 1_000_000.0
    assert metrics.shared_cpu_peak(folder, measure=measure(5e10), now=t0) == (5e10, "measured fp32 2048^2 matmul")
    # Another run 10 minutes later takes it from the folder without measuring.
    flops, source = metrics.shared_cpu_peak(folder, measure=measure(7e10), now=t0 + 600)
    assert (flops, measured) == (5e10, [5e10]) and source == "fp32 2048^2 matmul measured 10 min ago by a run of this machine"
    # After the hour, or for another matmul size, it is measured again (and the newer figure shared).
    assert metrics.shared_cpu_peak(folder, measure=measure(6e10), now=t0 + 3601)[0] == 6e10
    assert metrics.shared_cpu_peak(folder, n=1024, measure=measure(4e10), now=t0 + 3602)[0] == 4e10
    saved = json.loads((tmp_path / metrics.CPU_PEAK_FILE).read_text())
    assert saved["identity"]["n"] == 1024 and saved["identity"]["cpu"] and saved["flops"] == 4e10
    # A damaged file, or no folder to share through: measured, never an error.
    (tmp_path / metrics.CPU_PEAK_FILE).write_text("{not json")
    assert metrics.shared_cpu_peak(folder, measure=measure(3e10), now=t0)[0] == 3e10
    assert metrics.shared_cpu_peak(None, measure=measure(2e10), now=t0)[0] == 2e10
    assert metrics.shared_cpu_peak(str(tmp_path / "missing" / "folder"), measure=measure(1e10), now=t0)[0] == 1e10
    assert measured == [5e10, 6e10, 4e10, 3e10, 2e10, 1e10]
    assert not [p.name for p in tmp_path.iterdir() if p.name != metrics.CPU_PEAK_FILE]  # no temporary file left


def test_device_tables():
    assert table_lookup(PEAK_FLOPS, "NVIDIA H100 80GB HBM3") == 989e12
    assert table_lookup(PEAK_FLOPS, "NVIDIA H100 PCIe") == 756e12
    assert table_lookup(PEAK_FLOPS, "NVIDIA H200") == 989e12
    assert table_lookup(PEAK_FLOPS, "TPU v5 lite") == 197e12
    assert table_lookup(PEAK_FLOPS, "TPU v5") == 459e12
    # TensorCores per device: v5e has one, v5p (reported as "TPU v5" or "TPU v5p") two, v4 two, v3 one.
    assert [table_lookup(TPU_CORES, k) for k in ("TPU v3", "TPU v4", "TPU v5 lite", "TPU v5", "TPU v5p")] == \
        [1, 2, 1, 2, 2]


def test_tensorboard_reads_the_event_files_with_the_values_of_metrics_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = MetricWriter(str(tmp_path), enabled=True)
    for step in (1, 2, 3):
        w.write(step, {"train/loss": 1.5 / step, "train/lr": 1e-3 * step})
    w.close()
    events = EventAccumulator(str(tmp_path / "tb"))  # TensorBoard's reader: checks every record's CRC
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["train/loss", "train/lr"]
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    for tag in ("train/loss", "train/lr"):
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert got == [(r["step"], np.float32(r[tag])) for r in lines]


def test_writing_metrics_does_not_import_tensorflow(tmp_path):
    # TensorFlow's import costs every training process seconds; only dataset builders may need it.
    code = ("import sys; from vit_jax.train import trainer; from vit_jax.train.metrics import MetricWriter; "
            f"w = MetricWriter({str(tmp_path)!r}, enabled=True); w.write(1, {{'a': 1.0}}); w.close(); "
            "sys.exit('tensorflow' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
