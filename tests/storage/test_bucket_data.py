"""Datasets in a bucket (a real GCS API server on localhost, faults from FaultProxy): TFDS split specs everywhere,
a stream that is deterministic, resumes from a count and evaluates every example once, bad records substituted
without moving the stream, transient faults that change nothing, and one-line errors for what is missing."""

import numpy as np
import pytest

from tests.data.test_pipeline import EVAL_PP, TRAIN_PP, CorruptingSource, mesh_sharding, take
from vit_jax.data import datasets, pipeline
from vit_jax.storage import remote

SPECS = {"train[:10%]": 144, "train[99%:]": 14, "train[:1000]": 1000, "train[10%:20%]": 143, "train+test": 1797}


@pytest.fixture(scope="module")
def local_digits(digits_data_dir):
    return datasets.open_dataset("digits", data_dir=digits_data_dir, prepare=False)


@pytest.fixture(scope="module")
def bucket_digits(gcs, local_digits, digits_data_dir):
    """The session's digits, uploaded as prepare-data does it, and opened from the bucket."""
    url = f"{gcs.bucket}/tfds"
    if not remote.exists(f"{url}/digits/1.0.0/dataset_info.json"):
        datasets.upload_prepared(local_digits, digits_data_dir, url, progress=False)
    ds = datasets.open_dataset("digits", data_dir=url, prepare=False)
    assert ds.remote
    return ds


def ids(source, n=None):
    return [source[i]["id"] for i in range(len(source) if n is None else n)]


def take_open(it, n):
    """Like take(), leaving the iterator open for its counters."""
    return [{k: np.asarray(v) for k, v in next(it).items()} for _ in range(n)]


def every_batch(it):
    out = [{k: np.asarray(v) for k, v in b.items()} for b in it]
    it.close()
    return out


def test_split_specs_give_exact_counts_locally_and_in_a_bucket(local_digits, bucket_digits):
    train = ids(local_digits.source("train"))
    for ds in (local_digits, bucket_digits):
        assert {spec: ds.num_examples(spec) for spec in SPECS} == SPECS
        with pytest.raises(ValueError, match=r"has no split 'valid'.*it has test, train.*train\[:10%\]"):
            ds.num_examples("valid")
    assert ids(local_digits.source("train[10%:20%]")) == train[144:287]
    assert ids(local_digits.source("train[99%:]")) == train[-14:]
    assert ids(bucket_digits.source("train[:10%]")) == train[:144]
    both = local_digits.source("train+test")
    assert both[1437]["id"] == local_digits.source("test")[0]["id"]
    # The pipeline reads slices too: one epoch of train[:10%] is its 144 records, locally and streamed.
    sh = mesh_sharding((2, 1))
    for ds in (local_digits, bucket_digits):
        it = pipeline.train_iterator(ds, "train[:10%]", EVAL_PP, global_batch_size=16, sharding=sh, seed=1)
        records = (it.plan.schedule.records(np.arange(144)) if not ds.remote else
                   it.plan.order.records(np.arange(144)))
        it.close()
        assert sorted(records.tolist()) == list(range(144))


def test_stream_is_deterministic_resumes_from_the_step_and_evaluates_every_example_once(local_digits,
                                                                                         bucket_digits):
    kw = dict(pp=TRAIN_PP, global_batch_size=32, sharding=mesh_sharding(), seed=3, stream=dict(window=200))
    full = take(pipeline.train_iterator(bucket_digits, **kw), 12)
    again = take(pipeline.train_iterator(bucket_digits, **kw), 12)
    resumed_it = pipeline.train_iterator(bucket_digits, start_step=8, **kw)
    state = resumed_it.get_state()
    resumed = take(resumed_it, 4)
    assert state["stream"] == {"process_count": 1, "examples_per_process": 8 * 32}
    for a, b in zip(full, again):
        np.testing.assert_array_equal(a["image"], b["image"])
    for a, b in zip(full[8:], resumed):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])
    assert not np.array_equal(full[0]["label"], full[1]["label"])
    # Eval: one process reads the split in file order, so the batches equal the local ones (padding rows aside).
    ev = dict(pp=EVAL_PP, global_batch_size=64, sharding=mesh_sharding())
    streamed = every_batch(pipeline.eval_iterator(bucket_digits, "test", **ev))
    local = every_batch(pipeline.eval_iterator(local_digits, "test", **ev))
    assert len(streamed) == len(local) == 6 and sum(b["_mask"].sum() for b in streamed) == 360
    for a, b in zip(streamed, local):
        np.testing.assert_array_equal(a["_mask"], b["_mask"])
        real = a["_mask"] > 0
        for key in ("image", "label"):
            np.testing.assert_array_equal(a[key][real], b[key][real])


def test_a_bad_record_is_replaced_from_its_own_file_without_moving_the_stream(bucket_digits, monkeypatch):
    kw = dict(pp=EVAL_PP, global_batch_size=32, sharding=mesh_sharding(), seed=5, stream=dict(window=300))
    it = pipeline.train_iterator(bucket_digits, **kw)
    clean = take(it, 3)
    bad = int(it.plan.order.records(np.arange(40, 41))[0])  # the record at position 40: step 1, row 8
    real = bucket_digits.source
    monkeypatch.setattr(bucket_digits, "source", lambda split, records=None: CorruptingSource(
        real(split, records=records), {bad}))
    it = pipeline.train_iterator(bucket_digits, **kw)
    got = take_open(it, 3)
    assert it.num_substituted == 1 and it.plan.substitute(bad, 1) == bad + 1
    np.testing.assert_array_equal(got[0]["image"], clean[0]["image"])
    np.testing.assert_array_equal(got[2]["image"], clean[2]["image"])  # later steps are where they were
    assert not np.array_equal(got[1]["image"][8], clean[1]["image"][8])
    np.testing.assert_array_equal(np.delete(got[1]["image"], 8, 0), np.delete(clean[1]["image"], 8, 0))
    it.close()


def test_transient_faults_mid_read_change_nothing_and_are_counted(gcs, bucket_digits, proxy):
    kw = dict(pp=EVAL_PP, global_batch_size=32, sharding=mesh_sharding(), seed=7)
    clean = take(pipeline.train_iterator(bucket_digits, **kw), 2)
    before = remote.retries()
    # The shard's download: a 503, then a connection cut mid-body, then success; a metadata request dropped.
    shard = r"digits-train\.array_record.*alt=media"
    proxy.inject("503", match=shard, count=1)
    proxy.inject("cut", match=shard, count=1)
    proxy.inject("drop", match=r"^GET /storage/v1/b/", count=1)
    ds = datasets.open_dataset("digits", data_dir=f"{gcs.bucket}/tfds", prepare=False)
    faulty = take(pipeline.train_iterator(ds, **kw), 2)
    assert proxy.injected == {"503": 1, "cut": 1, "drop": 1}
    # gcsfs retried the 503 and the cut body; aiohttp itself resends an idempotent request whose pooled
    # connection closed before any answer (no client reports that one), else gcsfs retries it too.
    assert 2 <= remote.retries() - before <= 3
    # Each retry was silent; a run ends with one line counting them (vit_jax.main prints it).
    assert remote.recovered_summary().startswith(f"storage: recovered from {remote.retries()} transient error(s) by "
                                                 "retrying (HTTP 429/5xx, dropped or cut connections")
    for a, b in zip(clean, faulty):
        np.testing.assert_array_equal(a["image"], b["image"])


def test_each_streamed_file_costs_one_request(gcs, bucket_digits, proxy):
    """The spool lists the split's folder once for the files' sizes, then fetches each file with one ranged read:
    no metadata request per file (each would add the bucket's latency to every fetch)."""
    ds = datasets.open_dataset("digits", data_dir=f"{gcs.bucket}/tfds", prepare=False)
    first = len(proxy.log)
    take(pipeline.train_iterator(ds, pp=EVAL_PP, global_batch_size=32, sharding=mesh_sharding(), seed=3), 2)
    log = proxy.log[first:]
    media = [line for line in log if "digits-train.array_record" in line and "alt=media" in line]
    metadata = [line for line in log if "digits-train.array_record" in line and "alt=media" not in line]
    files = {line.split("?")[0] for line in media}
    assert files and len(media) == len(files) and metadata == []


def test_explains_in_one_line_what_another_process_count_does(bucket_digits):
    it = pipeline.train_iterator(bucket_digits, pp=EVAL_PP, global_batch_size=32, sharding=mesh_sharding(),
                                 start_step=10)
    assert it.explain_resume(it.get_state()) is None
    line = it.explain_resume({**it.get_state(), "stream": {"process_count": 4, "examples_per_process": 80}})
    it.close()
    assert "\n" not in line and "saved by 4 processes and this run has 1" in line
    assert "position 320 (step 10)" in line and "exact resume needs the same process count" in line


def test_missing_bucket_or_dataset_is_one_line_before_anything_else(gcs):
    with pytest.raises(remote.StorageError) as e:
        datasets.open_dataset("digits", data_dir="gs://no-such-bucket/tfds")
    assert str(e.value) == ("data_dir gs://no-such-bucket/tfds: bucket gs://no-such-bucket does not exist (or this "
                            "account cannot see it)")
    # A name GCS would refuse (tensorstore, which writes the checkpoints, does; the emulator does not): one line too,
    # not a failed checkpoint save after training has run.
    for bad in ("b", "My_Bucket", "-bucket", "a" * 64):
        with pytest.raises(remote.StorageError, match=rf"^data_dir gs://{bad}/tfds: '{bad}' is not a valid GCS bucket"):
            datasets.open_dataset("digits", data_dir=f"gs://{bad}/tfds")
    with pytest.raises(datasets.DataNotFoundError) as e:
        datasets.open_dataset("digits", data_dir=f"{gcs.bucket}/empty", prepare=False)
    assert str(e.value) == (f"digits is not prepared in {gcs.bucket}/empty: run `vit-jax prepare-data digits "
                            f"--data-dir {gcs.bucket}/empty`")
