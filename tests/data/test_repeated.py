"""Repeated augmentation (data/repeated.py): each image k times per global batch with its own augmentation draws,
the copies spread over the processes' row blocks, the stream a function of (seed, step) so resume is exact."""

import collections

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax.data import pipeline
from vit_jax.data.repeated import copy_layout
from vit_jax.errors import ConfigError

PP = "decode|resize(18)|random_crop(16)|value_range(-1,1)"


def sharding(shape=(4, 2)):
    devices = np.asarray(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    mesh = jax.sharding.Mesh(devices, ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    return NamedSharding(mesh, P(("data", "fsdp")))


def process_slice(batch: int, process: int, count: int) -> tuple[int, int]:
    return process * batch // count, (process + 1) * batch // count


def test_each_process_sees_its_copies():
    batch, k, procs = 24, 3, 3
    plan = pipeline.BatchPlan(1437, batch, train=True, seed=5, repeats=k)
    seen = collections.Counter()
    for step in range(6):
        records = plan.rows(step, 0, batch)[0]
        counts = collections.Counter(records.tolist())
        assert len(counts) == batch // k and set(counts.values()) == {k}  # B/k images, k copies each
        # copy c of the batch's j-th image is row c * B/k + j: with k processes, each holds one copy of every image
        slot, copy = copy_layout(np.arange(batch), batch, k)
        for p in range(procs):
            lo, hi = process_slice(batch, p, procs)
            mine, _, _ = plan.rows(step, lo, hi)
            assert sorted(mine.tolist()) == sorted(counts)  # every image of the batch, once
            np.testing.assert_array_equal(mine, records[lo:hi])  # a process's rows are the global batch's
            assert set(copy[lo:hi].tolist()) == {p}
        seen.update(counts)
    # The distinct images come from one shuffled pass: 6 steps x 8 images, none twice before the epoch ends.
    assert len(seen) == 6 * batch // k
    # Two processes for three copies: each still holds every image, the second holds one image's two copies.
    lo, hi = process_slice(batch, 1, 2)
    assert len(set(plan.rows(0, lo, hi)[0].tolist())) == batch // k


def test_copies_have_their_own_augmentation_and_their_label(digits_ds):
    it = pipeline.train_iterator(digits_ds, pp=PP, global_batch_size=24, sharding=sharding(), seed=1, repeats=3)
    b = {key: np.asarray(v) for key, v in next(it).items()}
    it.close()
    distinct = 8
    for j in range(distinct):
        rows = [j, j + distinct, j + 2 * distinct]
        assert len(set(b["label"][rows].tolist())) == 1
        images = b["image"][rows]
        assert not np.array_equal(images[0], images[1]) or not np.array_equal(images[1], images[2])
    different = sum(not np.array_equal(b["image"][j], b["image"][j + distinct]) for j in range(distinct))
    assert different >= distinct - 2  # a 3x3 grid of crop offsets: two draws agree 1 time in 9


def test_resume_and_topology(digits_ds):
    kw = dict(pp=PP, global_batch_size=24, seed=2, repeats=3)

    def take(it, n):
        out = [{key: np.asarray(v) for key, v in next(it).items()} for _ in range(n)]
        state = it.get_state()
        it.close()
        return out, state

    full, _ = take(pipeline.train_iterator(digits_ds, sharding=sharding(), **kw), 4)
    _, state = take(pipeline.train_iterator(digits_ds, sharding=sharding(), **kw), 2)
    assert state["repeats"] == 3 and state["step"] == 2
    resumed, _ = take(pipeline.train_iterator(digits_ds, sharding=sharding((1, 1)), state=state, **kw), 2)
    for a, b in zip(full[2:], resumed):  # exactly the uninterrupted run's batches, on another topology
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    plain, _ = take(pipeline.train_iterator(digits_ds, sharding=sharding(), **{**kw, "repeats": 1}), 1)
    assert len(set(plain[0]["label"].tolist())) > 3 and not np.array_equal(plain[0]["image"], full[0]["image"])
    with pytest.raises(ValueError, match="repeats=3"):  # a state saved with repeats needs the same setting
        pipeline.train_iterator(digits_ds, sharding=sharding(), state=state, **{**kw, "repeats": 1})


def test_config_errors(digits_ds):
    with pytest.raises(ConfigError, match="does not divide batch_size=32"):
        pipeline.train_iterator(digits_ds, pp=PP, global_batch_size=32, sharding=sharding(), repeats=3)
    with pytest.raises(ConfigError, match="give the copies per image"):
        pipeline.train_iterator(digits_ds, pp=PP, global_batch_size=32, sharding=sharding(), repeats=0)
