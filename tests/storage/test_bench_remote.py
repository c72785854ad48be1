"""`vit-jax bench data --remote` runs end to end on a few images and reports the numbers docs/BENCHMARKS.md quotes
(the speed goal itself is a benchmark figure, never a test)."""

import json
import os
import subprocess
import sys

import pytest

import vit_jax.bench
from vit_jax.bench import data_remote


def test_remote_data_bench_smoke(capsys):
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    args = ["data", "--remote", "--num-images", "48", "--shards", "6", "--window", "8", "--batch-size", "4", "--steps", "6",
            "--repeats", "1", "--image-size", "32", "--workers", "1", "--latency-ms", "20", "--output", "-"]
    assert vit_jax.bench.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert os.environ.get("STORAGE_EMULATOR_HOST") == before
    for side in ("local", "bucket"):
        assert result[side]["images"] == 24 and result[side]["images_per_s"] > 0
    assert result["bucket"]["files_fetched_timed"] > 0  # files kept being fetched while timed
    assert result["bucket_requests"] > 0 and result["ratio"] > 0 and result["ratio_per_cpu_s"] > 0
    assert result["latency_ms"] == 20
    # The localhost servers' CPU is reported (Linux /proc), so a reader sees what they take from the 2 cores: a
    # measured figure on both sides (None where /proc cannot be read). The few requests of these 6 steps take about
    # one clock tick (10 ms) of the servers, so its value here is 0 or 0.01: the reading itself is tested below.
    assert all(isinstance(result[side]["server_cpu_s"], float) for side in ("local", "bucket"))
    # The local side reads as a pod-size split would: this small split not kept parsed in memory.
    assert result["local_record_cache"] is False and result["local"]["record_cache"] is False


# A process that burns CPU until its own clock says `seconds`, prints that clock, and waits for its stdin to close.
BURN = """
import sys, time
while time.process_time() < float(sys.argv[1]):
    pass
print(time.process_time(), flush=True)
sys.stdin.read()
"""


def test_server_cpu_is_the_processes_cpu_time_from_proc():
    """server_cpu_s's reading (data_remote._cpu_s): user + system CPU seconds of the given processes, here two
    children that each burned a known amount (their own process_time, start-up included), to within two clock ticks
    of each (/proc counts in ticks of 1/SC_CLK_TCK s)."""
    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        pytest.skip("server_cpu_s is read from Linux /proc; elsewhere it is None")
    children = [subprocess.Popen([sys.executable, "-c", BURN, str(s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True) for s in (0.3, 0.5)]
    try:
        burned = [float(c.stdout.readline()) for c in children]  # each now idle until its stdin closes
        measured = [data_remote._cpu_s([c.pid]) for c in children]
        both = data_remote._cpu_s([c.pid for c in children])
    finally:
        for c in children:
            c.stdin.close()
            c.wait(10)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert measured == pytest.approx(burned, abs=2 * tick)
    assert both == pytest.approx(sum(measured), abs=1e-9)
    assert data_remote._cpu_s([children[0].pid]) is None  # gone: no figure rather than a wrong one
