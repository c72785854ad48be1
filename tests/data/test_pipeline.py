"""The input pipeline: determinism across topologies, exact resume, per-process slices, padded eval, robustness."""

import hashlib
import json

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax.data import indexing, pipeline
from vit_jax.data.decode import DecodeError

TRAIN_PP = "decode|inception_crop(32, area_min=30)|flip_lr|randaug(2, 5)|value_range(-1, 1)|onehot(10)"
EVAL_PP = "decode|value_range(-1, 1)|onehot(10)"


def mesh_sharding(shape=(4, 2), devices=None):
    devices = np.asarray(devices if devices is not None else jax.devices()[: int(np.prod(shape))]).reshape(shape)
    mesh = jax.sharding.Mesh(devices, ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    return NamedSharding(mesh, P(("data", "fsdp")))


def process_rows(global_batch_size: int, process_index: int, process_count: int) -> tuple[int, int]:
    """Rows [lo, hi) of the global batch that a process holds when rows are split evenly in process order."""
    per = global_batch_size // process_count
    return process_index * per, (process_index + 1) * per


def load_local_batch(loader, plan, step: int, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Rows [lo, hi) of the batch at `step`, loaded synchronously through the pipeline's own loader: what one
    process of several would hold."""
    records, positions, mask = plan.rows(step, lo, hi)
    rows = pipeline._Rows(len(records))
    loader.load_rows(rows, records, positions, 0, len(records), mask)
    return {**rows.arrays, **({"_mask": mask} if mask is not None else {})}


def to_numpy(batch):
    return {k: np.asarray(v) for k, v in batch.items()}


def digest(batch) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        h.update(key.encode() + np.ascontiguousarray(np.asarray(batch[key])).tobytes())
    return h.hexdigest()


def take(it, n):
    out = [to_numpy(next(it)) for _ in range(n)]
    it.close()
    return out


def test_batch_contract(digits_ds):
    it = pipeline.train_iterator(digits_ds, pp=TRAIN_PP, global_batch_size=16, sharding=mesh_sharding())
    batch = next(it)
    it.close()
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        "image": ((16, 32, 32, 3), np.float32), "labels": ((16, 10), np.float32), "label": ((16,), np.int32)}
    assert batch["image"].sharding.spec == P(("data", "fsdp"))
    b = to_numpy(batch)
    assert -1.0 <= b["image"].min() and b["image"].max() <= 1.0
    np.testing.assert_array_equal(b["labels"].argmax(1), b["label"])
    # Without onehot in the op string the stored labels become a multi-hot vector anyway.
    ev = next(iter(pipeline.eval_iterator(digits_ds, "test", "decode|value_range(0, 1)", global_batch_size=8,
                                          sharding=mesh_sharding())))
    assert ev["labels"].shape == (8, 10) and ev["_mask"].dtype == np.float32
    np.testing.assert_array_equal(np.asarray(ev["labels"]).argmax(1), np.asarray(ev["label"]))


def test_batches_are_a_function_of_seed_and_step_only(digits_ds):
    kw = dict(pp=TRAIN_PP, global_batch_size=32, seed=3)
    eight = take(pipeline.train_iterator(digits_ds, sharding=mesh_sharding(), num_workers=2, prefetch=3, **kw), 4)
    reordered = mesh_sharding(devices=jax.devices()[::-1])  # a different device order
    again = take(pipeline.train_iterator(digits_ds, sharding=reordered, num_workers=1, prefetch=0, **kw), 4)
    one = take(pipeline.train_iterator(digits_ds, sharding=mesh_sharding((1, 1)), num_workers=2, **kw), 4)
    assert [digest(b) for b in eight] == [digest(b) for b in again] == [digest(b) for b in one]
    other_seed = take(pipeline.train_iterator(digits_ds, sharding=mesh_sharding(), **{**kw, "seed": 4}), 1)
    assert digest(other_seed[0]) != digest(eight[0])


def test_exact_resume_in_the_middle_of_an_epoch(digits_ds):
    # 1437 examples / 64 per batch: the epoch ends inside step 22, between the interruption and the end.
    kw = dict(pp=TRAIN_PP, global_batch_size=64, sharding=mesh_sharding(), seed=7)
    full = [digest(b) for b in take(pipeline.train_iterator(digits_ds, **kw), 30)]
    it = pipeline.train_iterator(digits_ds, **kw)
    first = [digest(to_numpy(next(it))) for _ in range(11)]
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    assert state["step"] == 11
    resumed = pipeline.train_iterator(digits_ds, **{**kw, "sharding": mesh_sharding((2, 1))}, state=state)
    rest = [digest(b) for b in take(resumed, 19)]
    assert first + rest == full


def test_two_processes_load_disjoint_slices_whose_union_is_the_global_batch(digits_ds):
    loader = pipeline._Loader(digits_ds, "train", TRAIN_PP, seed=5)
    plan = pipeline.BatchPlan(len(loader.source), 32, train=True, seed=5)
    it = pipeline.train_iterator(digits_ds, pp=TRAIN_PP, global_batch_size=32, sharding=mesh_sharding(), seed=5)
    for step in range(3):
        whole = to_numpy(next(it))
        parts = [load_local_batch(loader, plan, step, *process_rows(32, p, 2)) for p in (0, 1)]
        records = [plan.rows(step, *process_rows(32, p, 2))[0] for p in (0, 1)]
        assert not set(records[0]) & set(records[1]) and len(set(records[0]) | set(records[1])) == 32
        for key in whole:
            np.testing.assert_array_equal(np.concatenate([parts[0][key], parts[1][key]]), whole[key])
    it.close()


def test_rows_come_from_the_sharding_and_must_be_contiguous():
    assert indexing.sharding_rows(mesh_sharding(), 16) == (0, 16)

    class Stub:  # what process 1 of 2 would see: its devices hold rows 8..16
        spec = P("data")

        def __init__(self, blocks):
            self.blocks = blocks

        def addressable_devices_indices_map(self, shape):
            return {i: (slice(lo, hi),) for i, (lo, hi) in enumerate(self.blocks)}

    assert indexing.sharding_rows(Stub([(12, 16), (8, 12)]), 16) == (8, 16)
    with pytest.raises(AssertionError, match="not contiguous"):
        indexing.sharding_rows(Stub([(0, 4), (8, 12)]), 16)


def test_epochs_are_permutations_and_cross_seamlessly():
    sched = indexing.EpochSchedule(10, seed=0)
    e0, e1 = sched.records(np.arange(10)), sched.records(np.arange(10, 20))
    assert sorted(e0) == sorted(e1) == list(range(10)) and list(e0) != list(e1)
    np.testing.assert_array_equal(sched.records(np.arange(7, 14)), np.concatenate([e0[7:], e1[:4]]))


def test_fraction_selects_a_fixed_nested_subset(digits_ds):
    small, large = indexing.subset_indices(1000, 0.1), indexing.subset_indices(1000, 0.2)
    assert len(small) == 100 and len(large) == 200 and set(small) <= set(large)
    np.testing.assert_array_equal(small, indexing.subset_indices(1000, 0.1))
    sched = indexing.EpochSchedule(1000, seed=1, fraction=0.1)
    assert set(sched.records(np.arange(300))) == set(small)
    with pytest.raises(ValueError, match="fraction"):
        indexing.subset_indices(10, 0.0)
    it = pipeline.train_iterator(digits_ds, pp=EVAL_PP, global_batch_size=16, sharding=mesh_sharding(), fraction=0.5)
    assert it.plan.schedule.size == 718 and it.get_state()["fraction"] == 0.5
    it.close()


@pytest.mark.parametrize("batch", [64, 48, 360])
def test_eval_counts_every_example_exactly_once_on_one_and_two_processes(digits_ds, batch):
    n = digits_ds.num_examples("test")
    steps = -(-n // batch)  # ceil: the last batch is padded
    masks = [np.asarray(b["_mask"]) for b in pipeline.eval_iterator(
        digits_ds, "test", EVAL_PP, global_batch_size=batch, sharding=mesh_sharding((2, 2)))]
    assert len(masks) == steps and sum(m.sum() for m in masks) == n
    loader = pipeline._Loader(digits_ds, "test", EVAL_PP, seed=0)
    plan = pipeline.BatchPlan(n, batch, train=False)
    counted = []
    for step in range(steps):
        for proc in (0, 1):
            lo, hi = process_rows(batch, proc, 2)
            records, _, mask = plan.rows(step, lo, hi)
            counted += list(records[mask > 0])
            if step == steps - 1:
                np.testing.assert_array_equal(load_local_batch(loader, plan, step, lo, hi)["_mask"], mask)
    assert sorted(counted) == list(range(n))


class CorruptingSource:
    """Wraps a source; records in `bad` come back with undecodable image bytes."""

    def __init__(self, source, bad):
        self.source, self.bad = source, set(bad)

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        ex = self.source[i]
        if i in self.bad:
            ex = {**ex, "image": b"\x89PNG garbage"}
        return ex


def test_undecodable_records_are_substituted_deterministically_and_counted(digits_ds):
    loader = pipeline._Loader(digits_ds, "train", EVAL_PP, seed=0)
    loader.source = CorruptingSource(loader.source, bad={3, 4})
    clean = pipeline._Loader(digits_ds, "train", EVAL_PP, seed=0)
    got = loader.load(3, position=17)
    np.testing.assert_array_equal(got["image"], clean.load(5, position=17)["image"])
    assert loader.substituted == 2
    loader.source = CorruptingSource(loader.source.source, bad=range(len(loader.source)))
    with pytest.raises(RuntimeError, match="prepare it again"):
        loader.load(0, position=0)
    with pytest.raises(DecodeError):
        pipeline.pp_lib.build("decode")({"image": b"nope"}, np.random.default_rng(0))


def test_iterator_survives_bad_records_and_exposes_the_count(digits_ds, monkeypatch):
    real = digits_ds.source("train")
    bad = set(range(0, len(real), 7))
    monkeypatch.setitem(digits_ds._sources, "train", CorruptingSource(real, bad))
    it = pipeline.train_iterator(digits_ds, pp=EVAL_PP, global_batch_size=64, sharding=mesh_sharding(), seed=2)
    batches = [to_numpy(next(it)) for _ in range(3)]
    records = it.plan.schedule.records(np.arange(3 * 64))
    assert it.num_substituted == sum(int(r) in bad for r in records) > 0
    it.close()
    assert all(np.isfinite(b["image"]).all() for b in batches)


def test_eval_masks_out_an_undecodable_record_and_counts_it_once(digits_ds, monkeypatch):
    from vit_jax.eval import classification

    n, batch, bad = digits_ds.num_examples("test"), 64, 5  # record 5 is also the padding of position 365
    kw = dict(pp=EVAL_PP, global_batch_size=batch, sharding=mesh_sharding())
    clean = [to_numpy(b) for b in pipeline.eval_iterator(digits_ds, "test", **kw)]
    monkeypatch.setitem(digits_ds._sources, "test", CorruptingSource(digits_ds.source("test"), {bad}))
    seen = []

    def eval_step(params, b):  # what the trainer's eval step sums, plus a record of every batch
        seen.append(to_numpy(b))
        return {"count": b["_mask"].sum(), "label": (b["_mask"] * b["label"]).sum()}

    it = pipeline.eval_iterator(digits_ds, "test", **kw)
    result = classification.evaluate(eval_step, None, it)
    assert result["count"] == n - 1 and result["undecodable"] == 1
    assert it.num_undecodable == 1 and it.num_substituted == 0
    mask = np.concatenate([b["_mask"] for b in seen])
    assert sorted(np.flatnonzero(mask)) == [p for p in range(n) if p != bad]  # every good example, once
    for got, want in zip(seen, clean):
        real = got["_mask"] > 0
        np.testing.assert_array_equal(got["image"][real], want["image"][real])
    labels = np.concatenate([b["label"] for b in clean])
    assert result["label"] * result["count"] == pytest.approx(labels[:n].sum() - labels[bad])


def test_set_state_rejects_a_state_from_other_settings(digits_ds):
    it = pipeline.train_iterator(digits_ds, pp=EVAL_PP, global_batch_size=16, sharding=mesh_sharding(), seed=1)
    with pytest.raises(ValueError, match="seed=2"):
        it.set_state({**it.get_state(), "seed": 2})
    it.close()


def test_value_range_and_normalize_write_into_the_offered_batch_row(digits_ds):
    loader = pipeline._Loader(digits_ds, "train", "decode|value_range(-1, 1)|onehot(10)", seed=0)
    want, _ = loader.load_counted(3, position=9)
    row = np.full((32, 32, 3), np.nan, np.float32)
    got, _ = loader.load_counted(3, position=9, image_out=row)
    assert got["image"] is row and pipeline.pp_lib.IMAGE_OUT not in got
    np.testing.assert_array_equal(row, want["image"])
    ops = pipeline.pp_lib.build("normalize((1, 2, 3), (4, 5, 6))")
    pixels = np.arange(2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 3)
    out = np.empty((2, 2, 3), np.float32)
    ex = ops({"image": pixels, pipeline.pp_lib.IMAGE_OUT: out}, np.random.default_rng(0))
    assert ex["image"] is out
    np.testing.assert_array_equal(out, ops({"image": pixels}, np.random.default_rng(0))["image"])
    wrong = np.empty((3, 2, 3), np.float32)  # a row that does not fit is left alone
    assert ops({"image": pixels, pipeline.pp_lib.IMAGE_OUT: wrong}, np.random.default_rng(0))["image"] is not wrong


def test_examples_of_different_sizes_are_a_clear_error(digits_ds):
    import itertools

    loader = pipeline._Loader(digits_ds, "train", EVAL_PP, seed=0)
    plan = pipeline.BatchPlan(len(loader.source), 4, train=True)
    calls = itertools.count()
    loader.preprocess = lambda ex, rng: {**ex, "image": np.zeros((2 + next(calls) % 2, 4, 3), np.float32)}
    with pytest.raises(ValueError, match=r"different 'image' shapes.*add a resize/crop op"):
        load_local_batch(loader, plan, 0, 0, 4)


class GatedSource(CorruptingSource):
    """Every read waits at a gate until the test opens it; counts the reads begun (`entered`) and finished."""

    def __init__(self, source):
        import threading

        super().__init__(source, bad=())
        self.gate = threading.Event()
        self.changed = threading.Condition()
        self.entered = self.reads = 0

    def __getitem__(self, i):
        with self.changed:
            self.entered += 1
            self.changed.notify_all()
        assert self.gate.wait(60), "the test never opened the gate"
        ex = super().__getitem__(i)
        with self.changed:
            self.reads += 1
        return ex


def test_close_stops_the_workers_within_one_example(digits_ds, monkeypatch):
    """Both workers are held inside their first read of batch 0 (batches 1 and 2 queued behind them) while close()
    begins; once released, each finishes the example it is on and reads no other. Events order every step: no
    sleeps, no read counts that depend on how fast the workers ran."""
    import threading

    gated = GatedSource(digits_ds.source("train"))
    monkeypatch.setitem(digits_ds._sources, "train", gated)
    it = pipeline.train_iterator(digits_ds, pp=EVAL_PP, global_batch_size=128, sharding=mesh_sharding(),
                                 num_workers=2, prefetch=2)
    it._fill()  # what next() does first: batches 0-2 submitted (two chunks each), without waiting for one
    with gated.changed:
        assert gated.changed.wait_for(lambda: gated.entered == 2, timeout=60), gated.entered
    shutting_down = threading.Event()
    shutdown = it._workers.shutdown

    def signalled_shutdown(*args, **kwargs):  # close() calls it after marking every batch in flight cancelled
        shutting_down.set()
        shutdown(*args, **kwargs)

    monkeypatch.setattr(it._workers, "shutdown", signalled_shutdown)
    closer = threading.Thread(target=it.close)
    closer.start()
    try:
        assert shutting_down.wait(60)
    finally:
        gated.gate.set()
        closer.join(60)
    assert not closer.is_alive()  # close() returned: the workers have exited
    assert gated.entered == gated.reads == 2  # the two examples in progress, and not one more


def host_iterator(ds, **kw):
    return pipeline.BatchIterator(ds, "train", TRAIN_PP, 32, mesh_sharding(), train=True, seed=4, fraction=1.0,
                                  start_step=0, end_step=None, num_workers=2, prefetch=2, **kw)


def test_batch_arrays_are_reused_only_when_nothing_references_them(digits_ds):
    reference = take(host_iterator(digits_ds, to_device=False), 12)
    # Dropped batches: their arrays come back for later batches, with the right contents.
    it = host_iterator(digits_ds, to_device=False)
    addresses = []
    for step in range(12):
        batch = next(it)
        addresses.append(batch["image"].ctypes.data)
        assert digest(batch) == digest(reference[step])
        del batch
    it.close()
    assert len(set(addresses)) < len(addresses)
    # Held batches, held views and held device arrays (which may alias host memory on CPU) are never reused.
    for to_device in (False, True):
        it = host_iterator(digits_ds, to_device=to_device)
        held, views = [], []
        for step in range(12):
            batch = next(it)
            if step % 2:
                held.append((step, batch))
            else:
                views.append((step, batch["image"][3:5]))
            del batch
        it.close()
        for step, batch in held:
            assert digest(batch) == digest(reference[step])
        for step, view in views:
            np.testing.assert_array_equal(np.asarray(view), reference[step]["image"][3:5])
