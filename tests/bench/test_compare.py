"""`bench train --compare PEER` (#17): peers run interleaved with our steps, the ratio is theirs over ours, and a peer
that is not installed is reported as such instead of failing the benchmark. By default a peer runs in a process of its
own, without vit_jax's process tuning."""

import importlib
import json
import os
import statistics
import sys
import textwrap
import time

import pytest

from tests.interop import require_timm
from vit_jax.bench import common, peers
from vit_jax.bench import train as bench_train
from vit_jax.models import vit_config

TINY = ["--variant", "Ti/16", "--image-size", "16", "--patch-size", "8", "--width", "32", "--depth", "1", "--mlp-dim",
        "64",
        "--num-heads", "2", "--num-classes", "10", "--steps", "3", "--warmup", "1", "--reference-n", "128",
        "--batch-size", "4", "--mesh", "1,1,1"]


def test_timed_loop_runs_each_peer_right_after_each_of_our_steps():
    calls = []
    a = peers.Peer("a", "", lambda: calls.append("a"), 0)
    b = peers.Peer("b", "", lambda: calls.append("b"), 0)
    loop = common.timed_loop(lambda: calls.append("ours"), 3, None, [a, b])
    assert calls == ["ours", "a", "b"] * 3
    assert len(loop["peer_times_s"]["a"]) == len(loop["peer_times_s"]["b"]) == len(loop["step_times_s"]) == 3


def test_timed_loop_counts_our_steps_page_faults():
    """A step that maps fresh memory faults every page in: the JSON's step_minor_faults shows it, step by step."""
    import mmap

    def step():  # 4 MiB of fresh anonymous memory, every page written: >= 1024 faults
        m = mmap.mmap(-1, 4 << 20)
        m.write(b"x" * (4 << 20))
        m.close()

    loop = common.timed_loop(step, 3, None)
    assert len(loop["step_minor_faults"]) == 3 and min(loop["step_minor_faults"]) >= 1000


def test_comparison_report_is_the_peers_time_over_ours():
    loop = {"step_times_s": [1.0, 2.0, 4.0], "peer_times_s": {"p": [3.0, 2.0, 2.0]}}
    r = common.comparison_report(loop, 8, [peers.Peer("p", "test peer", lambda: None, 0)], {"q": "q is not installed"})
    assert r["p"]["speed_ratio"] == pytest.approx(2.0 / 2.0)  # medians: peer 2 s, ours 2 s
    assert r["p"]["paired_speed_ratios"] == pytest.approx([3.0, 1.0, 0.5])
    assert r["p"]["paired_speed_ratio_median"] == pytest.approx(1.0)
    assert r["p"]["images_per_s"] == pytest.approx(4.0) and r["p"]["available"]
    assert r["q"] == {"available": False, "reason": "q is not installed"}


def test_a_peer_is_timed_interleaved_and_its_ratio_reported(tmp_path, monkeypatch, capsys):
    """A stand-in peer that sleeps a known time: the JSON holds its times, and the ratio is computed from them."""
    built = []

    def sleeper(model_cfg, optimizer_cfg, batch):
        built.append((model_cfg.width, model_cfg.depth, optimizer_cfg.name, batch))
        return peers.Peer("sleeper", "sleeps 50 ms", lambda: time.sleep(0.05), 0)

    monkeypatch.setitem(peers.PEERS, "sleeper", sleeper)
    out = tmp_path / "compare.json"
    assert bench_train.main([*TINY, "--compare", "sleeper", "--peer-process", "shared", "--output", str(out)]) == 0
    assert built == [(32, 1, "adamw", 4)]  # built once, for the benchmarked model, optimizer and batch
    r = json.loads(out.read_text())
    c = r["compare"]["sleeper"]
    assert c["available"] and len(c["step_times_s"]) == 3 and min(c["step_times_s"]) >= 0.05
    ours = r["timing"]["step_times_s"]
    assert c["speed_ratio"] == pytest.approx(statistics.median(c["step_times_s"]) / statistics.median(ours))
    assert "vit_jax is" in capsys.readouterr().out


def test_peers_not_installed_are_reported_not_fatal(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` now raises ImportError, as on a machine without it
    monkeypatch.setitem(sys.modules, "big_vision", None)
    out = tmp_path / "missing.json"
    assert bench_train.main([*TINY, "--compare", "timm", "--compare", "big_vision", "--peer-process", "shared",
                             "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    assert not r["compare"]["timm"]["available"] and "pip install torch timm" in r["compare"]["timm"]["reason"]
    assert not r["compare"]["big_vision"]["available"] and "PYTHONPATH" in r["compare"]["big_vision"]["reason"]
    assert r["throughput"]["images_per_s"] > 0  # ours is still timed
    printed = capsys.readouterr().out
    assert "--compare timm: not installed here" in printed and "--compare big_vision: not installed here" in printed


# Peers for the own-process tests: a module the peer's process can import (tmp_path on its PYTHONPATH).
PROBE = textwrap.dedent("""
    import os, time
    from vit_jax.bench import peers

    def probe(model_cfg, optimizer_cfg, batch):
        import jax
        dispatch = "async" if jax.config.read('jax_cpu_enable_async_dispatch') else "sync"
        print("frameworks may print")  # must not disturb the protocol
        return peers.Peer("probe", f"pid {os.getpid()}, {dispatch} dispatch, width {model_cfg.width}, "
                                   f"lr {optimizer_cfg.lr}, batch {batch}", lambda: time.sleep(0.05), 7)

    def missing(model_cfg, optimizer_cfg, batch):
        raise peers.PeerUnavailable("probe is not installed here")

    def crashing(model_cfg, optimizer_cfg, batch):
        raise ValueError("the peer failed to build")
""")


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    (tmp_path / "probe_peer.py").write_text(PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    module = importlib.import_module("probe_peer")
    for name in ("probe", "missing"):
        monkeypatch.setitem(peers.PEERS, name, getattr(module, name))
    return module


def test_a_peer_runs_in_its_own_process_with_its_frameworks_defaults(tmp_path, probe_module):
    """The default: the peer is built and stepped in a child process that has none of vit_jax's tuning (JAX's CPU
    dispatch stays asynchronous there while ours is synchronous), still interleaved, and the child is gone after."""
    import jax

    out = tmp_path / "own.json"
    assert bench_train.main([*TINY, "--compare", "probe", "--compare", "missing", "--output", str(out)]) == 0
    assert not jax.config.read("jax_cpu_enable_async_dispatch")  # the benchmark's own process is tuned
    r = json.loads(out.read_text())
    c = r["compare"]["probe"]
    assert c["process"] == "own" and c["params"] == 7 and min(c["step_times_s"]) >= 0.05
    pid = int(c["description"].split(",")[0].removeprefix("pid "))
    assert pid != os.getpid()
    assert c["description"].endswith("async dispatch, width 32, lr 0.001, batch 4")
    usage = c["process_usage_per_step"]  # the warm-up step, then the 3 timed ones
    assert len(usage) == 4 and all(set(u) == {"user_s", "system_s", "minor_faults"} for u in usage)
    with pytest.raises(ProcessLookupError):  # closed and reaped when the benchmark ended
        os.kill(pid, 0)
    assert r["compare"]["missing"] == {"available": False, "reason": "probe is not installed here"}


def test_a_peer_process_that_fails_is_a_clear_error(probe_module):
    from vit_jax.models import vit_config
    from vit_jax.train.config import default_config

    cfg = vit_config("Ti/16", image_size=16, patch_size=8, width=32, depth=1, mlp_dim=64, num_heads=2, num_classes=10)
    with pytest.raises(RuntimeError, match=r"peer process for crashing failed \(exit 1\)"):
        peers.own_process(probe_module.crashing, cfg, default_config().optimizer, 2)


def test_compare_refuses_what_the_peers_do_not_run(tmp_path):
    with pytest.raises(SystemExit, match="--mesh 1,1,1"):
        bench_train.main([*TINY[:-2], "--mesh", "2,1,1", "--compare", "timm", "--output", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="plain ViTs"):
        peers.timm_peer(vit_config("Ti/16", image_size=32, window_size=2, pool="gap"), None, 2)


def test_timm_peer_is_the_same_model():
    """timm's model has exactly our parameter count, and a step of it runs (timm comes with the interop extra, which
    `make test` installs; it is not a dependency of vit_jax)."""
    require_timm()
    from vit_jax.models.vit import FunctionalViT
    from vit_jax.train.config import default_config

    cfg = vit_config("Ti/16", image_size=32, patch_size=8, width=32, depth=2, mlp_dim=64, num_heads=2, num_classes=10)
    peer = peers.timm_peer(cfg, default_config().optimizer, 2)
    peer.step()
    assert "timm" in peer.description and peer.params == FunctionalViT(cfg).num_params()
