"""DINO's multi-crop batch across process counts, with real processes: the same DINO run as 1 process x 4 devices
and as 2 processes x 2 devices (local launcher, jax.distributed on localhost) gives the same loss at every step.
The crops are drawn on the devices from the step's key and each row's global index (data/multicrop.py), so which
process holds a row must not change its crops, iBOT masks or the teacher's centres; a crop drawn per process would
move the losses by far more than the 1e-4 that reduction order allows."""

from __future__ import annotations

import pytest

from tests.launch.helpers import losses, one_and_two_processes

pytestmark = pytest.mark.slow

STEPS = 3
# A tiny DINO on the demo's digits (global batch 32): 2 global 16 px crops + 2 local 8 px crops with DINO's colour
# augmentations, iBOT masks and KoLeo, a 64-prototype head; no evaluation (the losses are what is compared).
DINO = ("--config.objective=dino", "--config.model.width=32", "--config.model.depth=1", "--config.model.mlp_dim=64",
        "--config.model.num_heads=2", "--config.model.pool=token", "--config.loss.label_smoothing=0.0",
        "--config.data.pp_train=decode|resize(16)|value_range(-1,1)", "--config.dino.head_hidden=64",
        "--config.dino.head_bottleneck=16", "--config.dino.prototypes=64", "--config.dino.local_crops=2",
        "--config.dino.local_crop_size=8", "--config.dino.flip=False", "--config.eval.evaluators=()")


def test_dino_crops_and_losses_do_not_depend_on_the_process_count(digits_dir, tmp_path):
    runs = one_and_two_processes(tmp_path, digits_dir, STEPS, DINO)
    one, two = losses(runs["one"]), losses(runs["two"])
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    worst = max(abs(one[s] - two[s]) for s in one)
    assert worst <= 1e-4, f"largest per-step loss difference {worst:.2e}: {one} vs {two}"
