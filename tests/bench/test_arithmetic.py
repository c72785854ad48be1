"""The benchmark arithmetic: throughput / TFLOP/s / MFU, the CPU reference ratios, memory peaks and HBM fit."""

import argparse
import types

import pytest

from vit_jax.bench import common, plan


def test_throughput_of_a_known_step():
    # 32 images of 10 GFLOP each in 0.5 s on 2 devices with a 100 TFLOP/s peak each.
    t = common.throughput(step_time_s=0.5, batch=32, flops_per_image=10e9, peak_flops_per_device=100e12,
                          num_devices=2)
    assert t["images_per_s"] == pytest.approx(64.0)
    assert t["flops_per_step"] == pytest.approx(320e9)
    assert t["achieved_tflops_per_s"] == pytest.approx(0.64)
    assert t["achieved_tflops_per_s_per_device"] == pytest.approx(0.32)
    assert t["peak_tflops_per_s_per_device"] == pytest.approx(100.0)
    assert t["mfu"] == pytest.approx(0.64e12 / 200e12)


def test_cpu_reference_ratios_pair_each_step_with_the_matmuls_around_it():
    ref = types.SimpleNamespace(n=4, flops=100.0)  # 100 FLOP per matmul
    loop = {"step_times_s": [1.0, 2.0, 1.0], "step_cpu_s": [2.0, 4.0, 2.0],
            "reference_times_s": [1.0, 1.0, 2.0, 2.0], "reference_cpu_s": [2.0, 2.0, 4.0, 4.0]}
    r = common.cpu_reference_report(loop, ref, flops_per_step=50.0)
    # step FLOP/s 50, 25, 50 vs matmul FLOP/s 100, 100/1.5, 50
    assert r["paired_ratios"] == pytest.approx([0.5, 0.25 * 1.5, 1.0])
    assert r["paired_ratio_median"] == pytest.approx(0.5)
    assert r["matmul_tflops_per_s"] == pytest.approx(100.0 / 1.5 / 1e12)
    assert r["matmul_tflops_per_s_best"] == pytest.approx(100.0 / 1e12)
    assert r["cpu_time_ratio"] == pytest.approx((50.0 / 2.0) / (100.0 / 3.0))
    assert r["ratio_vs_best_matmul"] == pytest.approx((50.0 / 1.0) / 100.0)


def test_compiled_memory_peak_is_arguments_plus_outputs_minus_donated_plus_temporaries():
    stats = types.SimpleNamespace(argument_size_in_bytes=1000, output_size_in_bytes=900, alias_size_in_bytes=800,
                                  temp_size_in_bytes=5000, generated_code_size_in_bytes=7)
    m = common.compiled_memory(types.SimpleNamespace(memory_analysis=lambda: stats))
    assert m["peak_estimate_bytes"] == 1000 + 900 - 800 + 5000
    assert common.compiled_memory(types.SimpleNamespace(memory_analysis=lambda: None)) == {"available": False}


def test_fits_against_a_given_hbm_size():
    gib = common.GIB
    assert plan.fits(15 * gib, 16 * gib)
    assert not plan.fits(17 * gib, 16 * gib)
    assert not plan.fits(15 * gib, 16 * gib, usable=0.9)  # 15 > 14.4
    r = plan.decide({"peak_bytes": 15 * gib, "estimate_bytes": 12 * gib}, 16 * gib, 0.9, "xla")
    assert (r["fits_xla"], r["fits_estimate"], r["fits"]) == (False, True, False)
    assert plan.decide(dict(r), 16 * gib, 0.9, "estimate")["fits"]


def test_accelerator_table_and_mesh_resolution():
    ns = argparse.Namespace(hbm_gib=0.0, accelerator="v3")
    assert plan.hbm_bytes(ns)[0] == 16 * common.GIB
    assert plan.hbm_bytes(argparse.Namespace(hbm_gib=40.0, accelerator="v3"))[0] == 40 * common.GIB
    assert {k: v[1] / common.GIB for k, v in plan.ACCELERATORS.items()} == {
        "v3": 16, "v4": 32, "v5e": 16, "v5p": 95, "a100-40": 40, "a100-80": 80, "h100": 80, "h200": 141}
    with pytest.raises(SystemExit, match="unknown --accelerator"):
        plan.hbm_bytes(argparse.Namespace(hbm_gib=0.0, accelerator="v9"))
    assert plan.resolve_mesh("1,-1,1", 64) == (1, 64, 1)
    assert plan.resolve_mesh("-1,8,2", 64) == (4, 8, 2)
    with pytest.raises(SystemExit):
        plan.resolve_mesh("3,-1,1", 64)


def test_search_takes_the_first_group_that_fits_with_the_smallest_fsdp(monkeypatch):
    """The search order on a fake planner: activations fall with remat, state falls with FSDP degree."""
    gib = common.GIB
    activations = {("none", 1): 40, ("dots", 1): 20, ("dots_no_batch", 1): 9, ("full", 1): 2}
    compiled = []

    def fake_plan_one(spec, compile_step=True):
        data, fsdp, tensor = (int(x) for x in spec["mesh"].split(","))
        state = 32.0 / fsdp  # GiB of params + optimizer state per device
        r = {"mesh": {"data": data, "fsdp": fsdp, "tensor": tensor}, "state_bytes_per_device": state * gib,
             "params_bytes_per_device": state / 3 * gib, "model": "fake", "batch": spec["batch"],
             "dtype": "float32", "remat": spec["remat"], "micro_batches": spec["micro_batches"],
             "opt_state_bytes_per_device": state * 2 / 3 * gib}
        if compile_step:
            compiled.append((spec["remat"], spec["micro_batches"], fsdp))
            act = activations.get((spec["remat"], spec["micro_batches"]), 1000)
            r.update(temp_bytes=act * gib, peak_bytes=(state * 4 / 3 + act) * gib, estimate_bytes=(state + act) * gib)
        return r

    monkeypatch.setattr(plan, "plan_one", fake_plan_one)
    spec = {"devices": 8, "mesh": "1,8,1", "batch": 64, "remat": "none", "micro_batches": 1}
    out = plan.search(spec, hbm=16 * gib, usable=1.0, criterion="xla")
    choice = out["choice"]
    # none (40 GiB) and dots (20 GiB) never fit; dots_no_batch fits at fsdp 8 (9 + 5.3) and fsdp 4 (9 + 10.7 > 16: no)
    assert (choice["remat"], choice["micro_batches"], choice["mesh"]["fsdp"]) == ("dots_no_batch", 1, 8)
    assert compiled[:3] == [("none", 1, 8), ("dots", 1, 8), ("dots_no_batch", 1, 8)]
    activations[("dots_no_batch", 1)] = 4  # now fsdp 4 fits (4 + 10.7) and is cheaper than fsdp 8
    compiled.clear()
    choice = plan.search(spec, hbm=16 * gib, usable=1.0, criterion="xla")["choice"]
    assert (choice["remat"], choice["mesh"]["fsdp"]) == ("dots_no_batch", 4)
    assert ("dots_no_batch", 1, 2) not in compiled  # 4 + 21 GiB cannot fit: skipped without compiling
    assert plan.search(spec, hbm=1 * gib, usable=1.0, criterion="xla")["choice"] is None


def test_roofline_of_a_known_step():
    from vit_jax import hardware
    from vit_jax.bench.roofline import core_days, roofline

    v3 = hardware.get("v3")  # per core (JAX device): 61.5 TFLOP/s, 450 GB/s HBM, 4 x 656 Gbit/s / 2 ICI
    r = roofline(v3, num_devices=128, batch=4096, step_flops=3.0e12, model_flops=128 * 2.4e12, hbm_bytes=9e9,
                 ici_bytes=4.1e9)
    assert r["compute_s"] == pytest.approx(3.0e12 / 61.5e12)  # 48.8 ms
    assert r["hbm_s"] == pytest.approx(9e9 / 450e9)  # 20 ms
    assert r["ici_s"] == pytest.approx(4.1e9 / (4 * 656e9 / 8 / 2))  # 25 ms
    assert r["bound_by"] == "compute" and r["step_time_lower_bound_s"] == r["compute_s"]
    assert r["roofline_img_per_s"] == pytest.approx(4096 / (3.0e12 / 61.5e12))  # 83,968 img/s
    assert r["mfu_ceiling"] == pytest.approx(2.4 / 3.0)  # remat recompute: 3.0 TFLOP counted for 2.4 of model FLOPs
    r = roofline(v3, num_devices=128, batch=4096, step_flops=1e12, model_flops=128e12, hbm_bytes=45e9, ici_bytes=0)
    assert r["bound_by"] == "hbm" and r["step_time_lower_bound_s"] == pytest.approx(0.1)
    assert r["mfu_ceiling"] == pytest.approx(1e12 / (61.5e12 * 0.1))
    # 1M images at 10k img/s on 128 v3 cores (one core per device): 100 s x 128 cores = 0.148 core-days
    assert core_days(1e6, 1e4, 128, v3) == pytest.approx(100 * 128 / 86400)
    assert core_days(1e6, 1e4, 64, hardware.get("v4")) == pytest.approx(100 * 128 / 86400)  # v4: 2 cores per device
