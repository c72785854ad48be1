"""The same training on 1 device, on 8 simulated devices with data x FSDP, and with data x FSDP x tensor:
identical loss trajectories (the 2-process version is tests/launch/)."""

import jax
import numpy as np
import pytest

from vit_jax.data import pipeline
from vit_jax.train.config import resolve_durations
from vit_jax.train.program import build_program
from tests.train.test_step import tiny_config


def losses(digits_data_dir, mesh, devices, steps=3, micro_batches=1):
    c = tiny_config(**{"mesh.data": mesh[0], "mesh.fsdp": mesh[1], "mesh.tensor": mesh[2],
                       "micro_batches": micro_batches, "model.image_size": 16, "model.width": 64,
                       "model.num_heads": 4, "model.mlp_dim": 128})
    c.data.pp_train = "decode|resize(16)|value_range(-1,1)"
    ds = pipeline.open_dataset("digits", data_dir=digits_data_dir)
    prog = build_program(c, ds.num_classes, resolve_durations(c, ds.num_examples("train")), devices=devices)
    state = prog.init_state(0)
    it = pipeline.train_iterator(ds, "train", c.data.pp_train, global_batch_size=c.batch_size,
                                 sharding=prog.batch_sh, seed=0)
    out = []
    try:
        for _ in range(steps):
            state, m = prog.train_step(state, next(it))
            out.append(float(m["loss"]))
    finally:
        it.close()
    # The parameters really are distributed as configured.
    kernel = state["params"]["encoder"]["blocks"]["mlp"]["fc1"]["kernel"]
    return out, kernel.sharding.spec


def test_loss_trajectory_is_the_same_on_any_mesh(digits_data_dir):
    ref, spec1 = losses(digits_data_dir, (1, 1, 1), jax.devices()[:1])
    fsdp, spec_fsdp = losses(digits_data_dir, (2, 4, 1), jax.devices())
    tp, spec_tp = losses(digits_data_dir, (2, 2, 2), jax.devices())
    accum, _ = losses(digits_data_dir, (4, 2, 1), jax.devices(), micro_batches=2)
    assert tuple(spec_fsdp) == (None, "fsdp", None) and tuple(spec_tp) == (None, "fsdp", "tensor")
    assert len(set(ref)) == len(ref)  # parameters change from step to step
    np.testing.assert_allclose(fsdp, ref, atol=1e-4)
    np.testing.assert_allclose(tp, ref, atol=1e-4)
    np.testing.assert_allclose(accum, ref, atol=1e-4)
