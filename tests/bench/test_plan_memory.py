"""The memory planner on a tiny model and 8 simulated devices: per-device bytes from the shardings and XLA."""

import jax
import numpy as np
import pytest

from vit_jax.bench import common, plan

SPEC = dict(variant="Ti/16", image_size=16, num_classes=10, batch=16, dtype="float32", remat="none", scan=True,
            devices=8, steps=0, warmup=0, width=64, depth=2, mlp_dim=128, heads=4, patch=8, optimizer="adamw",
            mu_dtype="float32", micro_batches=1, pool="token", window_size=0, global_blocks=(), rel_pos=False)


def test_plan_one_reports_per_device_bytes():
    assert jax.device_count() == 8
    r = plan.plan_one(dict(SPEC, mesh="1,8,1"))
    for field in ("params_bytes_per_device", "opt_state_bytes_per_device", "temp_bytes", "peak_bytes", "xla",
                  "saved_activation_bytes", "estimate_bytes", "compile_s"):
        assert field in r, field
    assert r["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1} and r["per_device_batch"] == 2
    # Every kernel with an `embed` axis is split 8 ways; the rest (biases over mlp, norms, the 10-class head bias...)
    # is replicated. Recount both from the model's own axes and compare with the planner.
    from vit_jax.bench.common import build
    import argparse

    program = build(argparse.Namespace(**dict(SPEC, mesh="1,8,1")))
    sharded = replicated = 0
    for axes, shape in zip(jax.tree.leaves(program.model.logical_axes, is_leaf=lambda x: isinstance(x, tuple)),
                           jax.tree.leaves(program.model.shapes)):
        n = int(np.prod(shape.shape)) * 4
        if "embed" in axes and shape.shape[axes.index("embed")] % 8 == 0:
            sharded += n
        else:
            replicated += n
    assert sharded > replicated
    assert r["params_bytes_total"] == sharded + replicated
    assert r["params_bytes_per_device"] == sharded // 8 + replicated
    assert r["opt_state_bytes_per_device"] == pytest.approx(2 * r["params_bytes_per_device"], abs=64)  # mu, nu, count
    xla = r["xla"]
    # the donated train state is the aliased part; arguments = state + this device's slice of the batch
    assert xla["alias_size_in_bytes"] == r["state_bytes_per_device"]
    # (the integer `label` column is unused by the step and pruned by jit)
    assert xla["argument_size_in_bytes"] == pytest.approx(r["state_bytes_per_device"] + r["batch_bytes_per_device"],
                                                         abs=8 * r["per_device_batch"])
    assert r["peak_bytes"] == xla["argument_size_in_bytes"] + xla["output_size_in_bytes"] - \
        xla["alias_size_in_bytes"] + xla["temp_size_in_bytes"]
    assert r["estimate_bytes"] == r["peak_bytes"]  # float32: nothing to correct
    # the same model data-parallel holds every parameter on every device
    dp = plan.plan_one(dict(SPEC, mesh="8,1,1"), compile_step=False)
    assert dp["params_bytes_per_device"] == r["params_bytes_total"]


def test_decide_against_hbm_and_the_bf16_estimate():
    r = plan.plan_one(dict(SPEC, mesh="1,8,1", dtype="bfloat16"))
    # XLA:CPU keeps bf16 matmul results in f32; the estimate subtracts the difference of the saved activations
    assert 0.4 < r["saved_activation_bytes"] / r["saved_activation_bytes_fp32"] < 0.75
    assert r["estimate_bytes"] == r["peak_bytes"] - (r["saved_activation_bytes_fp32"] - r["saved_activation_bytes"])
    between = (r["estimate_bytes"] + r["peak_bytes"]) / 2
    d = plan.decide(dict(r), hbm=between, usable=1.0, criterion="xla")
    assert d["fits_estimate"] and not d["fits_xla"] and not d["fits"]
    assert plan.decide(dict(r), hbm=between, usable=1.0, criterion="estimate")["fits"]
    assert plan.decide(dict(r), hbm=r["peak_bytes"] * 2, usable=0.5, criterion="xla")["fits"]
    assert not plan.decide(dict(r), hbm=r["peak_bytes"] * 2, usable=0.49, criterion="xla")["fits"]
    assert common.fmt_bytes(r["peak_bytes"])
