"""Metric writing across restarts, and the hardware tables behind MFU and TPU-core-days."""

import json

from vit_jax.train.metrics import PEAK_FLOPS, TPU_CORES, MetricWriter, read_jsonl, table_lookup


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


def test_device_tables():
    assert table_lookup(PEAK_FLOPS, "NVIDIA H100 80GB HBM3") == 989e12
    assert table_lookup(PEAK_FLOPS, "NVIDIA H100 PCIe") == 756e12
    assert table_lookup(PEAK_FLOPS, "NVIDIA H200") == 989e12
    assert table_lookup(PEAK_FLOPS, "TPU v5 lite") == 197e12
    assert table_lookup(PEAK_FLOPS, "TPU v5") == 459e12
    # TensorCores per device: v5e has one, v5p (reported as "TPU v5" or "TPU v5p") two, v4 two, v3 one.
    assert [table_lookup(TPU_CORES, k) for k in ("TPU v3", "TPU v4", "TPU v5 lite", "TPU v5", "TPU v5p")] == \
        [1, 2, 1, 2, 2]
