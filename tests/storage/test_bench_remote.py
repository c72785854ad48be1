"""`vit-jax bench data --remote` runs end to end on a few images and reports the numbers docs/BENCHMARKS.md quotes
(the speed goal itself is a benchmark figure, never a test)."""

import json
import os

import vit_jax.bench


def test_remote_data_bench_smoke(capsys):
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    args = ["data", "--remote", "--num-images", "48", "--shards", "6", "--window", "8", "--batch", "4", "--steps", "6",
            "--repeats", "1", "--size", "32", "--workers", "1", "--latency-ms", "20", "--json", "-"]
    assert vit_jax.bench.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert os.environ.get("STORAGE_EMULATOR_HOST") == before
    for side in ("local", "bucket"):
        assert result[side]["images"] == 24 and result[side]["images_per_s"] > 0
    assert result["bucket"]["files_fetched_timed"] > 0  # files kept being fetched while timed
    assert result["bucket_requests"] > 0 and result["ratio"] > 0 and result["ratio_per_cpu_s"] > 0
    assert result["latency_ms"] == 20
    # The localhost servers' CPU is reported (Linux /proc), so a reader sees what they take from the 2 cores.
    assert result["bucket"]["server_cpu_s"] >= 0 and result["local"]["server_cpu_s"] >= 0
    # The local side reads as a pod-size split would: this small split not kept parsed in memory.
    assert result["local_record_cache"] is False and result["local"]["record_cache"] is False
