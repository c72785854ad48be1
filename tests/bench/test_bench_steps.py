"""`bench train` / `bench eval` end to end on a tiny model: the JSON has every field and its numbers agree."""

import json
import math

import numpy as np
import pytest

from tests.launch.helpers import ROOT
from vit_jax.bench import eval as bench_eval
from vit_jax.bench import train as bench_train

TINY = ["--variant", "Ti/16", "--image-size", "16", "--patch-size", "8", "--width", "32", "--depth", "1", "--mlp-dim",
        "64",
        "--num-heads", "2", "--num-classes", "10", "--steps", "3", "--warmup", "1", "--reference-n", "128",
        "--compile-cache"]


def _check_consistent(r, batch, devices, flops_per_image, attention):
    t = r["throughput"]
    median = r["timing"]["median"]
    assert t["step_time_s"] == median == sorted(r["timing"]["step_times_s"])[1]  # median of 3
    assert t["images_per_s"] == pytest.approx(batch / median)
    assert t["flops_per_step"] == pytest.approx(flops_per_image * batch)
    assert t["achieved_tflops_per_s"] == pytest.approx(flops_per_image * batch / median / 1e12)
    assert t["achieved_tflops_per_s_per_device"] == pytest.approx(t["achieved_tflops_per_s"] / devices)
    # CPU: the peak is the same-process matmul rate, shared by the simulated devices
    ref = r["cpu_reference"]
    assert t["peak_tflops_per_s_per_device"] == pytest.approx(ref["matmul_tflops_per_s"] / devices)
    assert t["mfu"] == pytest.approx(t["achieved_tflops_per_s"] / ref["matmul_tflops_per_s"])
    assert len(ref["paired_ratios"]) == 3 and len(r["cpu_reference"]) >= 6
    assert r["compile"]["compile_s"] > 0 and r["compile"]["total_s"] >= r["compile"]["compile_s"]
    mem = r["memory"]["xla"]
    assert mem["available"] and mem["peak_estimate_bytes"] >= mem["argument_size_in_bytes"] > 0
    env = r["environment"]
    assert env["platform"] == "cpu" and env["jax"] and env["device_count"] == 8
    assert env["cpu_attention_kernel_unavailable"] is None
    assert r["attention_kernel"] == attention


def test_bench_train_json(tmp_path):
    out = tmp_path / "train.json"
    assert bench_train.main(TINY + ["--batch-size", "8", "--mesh", "2,2,1", "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["benchmark"] == "train" and r["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
    assert r["model"]["params"] > 0 and r["optimizer"] == "adamw"
    # training FLOPs are 3x the forward: 2 * patch (16 x 4 px... ) etc. are checked in tests/models; here the ratio
    from vit_jax.models import vit_config
    from vit_jax.models.flops import vit_flops

    cfg = vit_config("Ti/16", image_size=16, patch_size=8, width=32, depth=1, mlp_dim=64, num_heads=2, num_classes=10)
    assert r["model"]["flops_per_image"] == pytest.approx(vit_flops(cfg).train)
    _check_consistent(r, 8, 4, r["model"]["flops_per_image"], "vit_jax_cpu")  # float32 on CPU: our kernel
    state = r["state_bytes_per_device"]
    assert 0 < state["params"] < state["opt_state"]  # Adam: two moments per parameter
    # Three steps from a zero-initialised head on 10 classes: the loss is still about ln(10) = 2.30, and finite.
    assert math.isfinite(r["final_loss"]) and r["final_loss"] == pytest.approx(math.log(10), abs=0.5)


def test_bench_eval_json(tmp_path):
    out = tmp_path / "eval.json"
    assert bench_eval.main(TINY + ["--batch-size", "8", "--mesh", "1,1,1", "--cpu-attention", "xla",
                                   "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["benchmark"] == "eval" and r["examples_counted"] == 8 and r["args"]["cpu_attention"] == "xla"
    from vit_jax.models import vit_config
    from vit_jax.models.flops import vit_flops

    cfg = vit_config("Ti/16", image_size=16, patch_size=8, width=32, depth=1, mlp_dim=64, num_heads=2, num_classes=10)
    assert r["model"]["flops_per_image"] == pytest.approx(vit_flops(cfg).forward)
    _check_consistent(r, 8, 1, r["model"]["flops_per_image"], "xla")  # asked for XLA's ops


def test_compile_only_reports_compile_time_and_memory_without_running(tmp_path):
    out = tmp_path / "aot.json"
    assert bench_train.main(TINY + ["--batch-size", "8", "--mesh", "1,1,1", "--scan", "--compile-only",
                                    "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["compile_only"] and r["compile"]["compile_s"] > 0 and r["args"]["scan"]
    assert r["memory"]["xla"]["temp_size_in_bytes"] > 0
    assert "timing" not in r and "final_loss" not in r


def test_windowed_attention_options_reach_the_benchmarked_model(tmp_path):
    """SAM-style options (#16): --window-size/--global-blocks/--rel-pos build the windowed model, counted as such."""
    from vit_jax.models import vit_config
    from vit_jax.models.flops import vit_flops

    out = tmp_path / "windowed.json"
    size = ["--image-size", "32", "--depth", "2", "--pool", "gap"]
    args = [*TINY, *size, "--batch-size", "8", "--mesh", "1,1,1", "--compile-only", "--output", str(out)]
    assert bench_train.main([*args, "--window-size", "2", "--global-blocks", "1", "--rel-pos"]) == 0
    r = json.loads(out.read_text())
    windowed = vit_config("Ti/16", image_size=32, patch_size=8, width=32, depth=2, mlp_dim=64, num_heads=2,
                          num_classes=10, window_size=2, global_blocks=(1,), rel_pos=True, pool="gap")
    assert r["model"]["flops_per_image"] == pytest.approx(vit_flops(windowed).train)
    assert r["model"]["flops_per_image"] < vit_flops(windowed.replace(window_size=0, global_blocks=())).train


def test_a_bit_resnet_is_benchmarked_by_name(tmp_path):
    """#18: `--variant BiT-...` builds the trainer's ResNet; its FLOPs are the ResNet count, it has no token count."""
    from vit_jax.models.bit_config import bit_config
    from vit_jax.models.build import model_flops

    out = tmp_path / "bit.json"
    assert bench_train.main(["--variant", "BiT-R1-1x1", "--image-size", "32", "--num-classes", "10", "--batch-size",
                             "2",
                             "--mesh", "1,1,1", "--compile-only", "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    cfg = bit_config("BiT-R1-1x1", num_classes=10, image_size=32)
    assert r["model"]["name"] == "BiT-R1-1x1" and r["model"]["seq_len"] is None
    assert r["model"]["flops_per_image"] == pytest.approx(model_flops(cfg).train)


def test_bench_train_times_any_objective_from_its_config(tmp_path):
    """`bench train --config`: the trainer config's objective, batch, mesh and dtype, on a synthetic batch of that
    objective's fields (train/objectives/ batch_spec: here images and per-pixel labels)."""
    out = tmp_path / "r.json"
    assert bench_train.main(["--config", str(ROOT / "configs" / "demo_seg.py"), "--config.segmentation.num_classes=5",
                             "--steps", "1", "--warmup", "0", "--reference-n", "128", "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    assert np.isfinite(r["final_loss"]) and r["mesh"]["data"] == 8 and r["args"]["batch"] == 64
    assert r["args"]["overrides"] == ["--config.segmentation.num_classes=5"]
