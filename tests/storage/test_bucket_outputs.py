"""What vit_jax writes into a bucket: a dataset by prepare-data (uploaded last-metadata-first, resumable, one-line
errors) and a run's metrics (metrics.jsonl rewritten on flush, TensorBoard events uploaded from a local mirror)."""

import json

import pytest

from vit_jax.commands import prepare_data as prepare
from vit_jax.data import datasets
from vit_jax.storage import remote
from vit_jax.storage.jsonl import read_jsonl
from vit_jax.train.metrics import MetricWriter


def uploads(proxy, since: int) -> list[str]:
    """Base names of the objects uploaded since the proxy's upload number `since`, in order."""
    return [name.rsplit("/", 1)[1] for name in proxy.uploads[since:]]


def test_prepare_data_uploads_metadata_last_and_a_rerun_resumes(fresh_url, proxy, tmp_path, capsys):
    staging = str(tmp_path / "staging")
    argv = ["digits", "--data-dir", fresh_url, "--staging-dir", staging, "--keep-staging", "--no-verify"]
    start = len(proxy.uploads)
    assert prepare.main(argv) == 0
    names = uploads(proxy, start)
    assert names[-2:] == ["features.json", "dataset_info.json"] and len(names) == 7, names
    out = capsys.readouterr().out
    assert "uploaded digits to " in out and '"train": 1437' in out
    # A crash before the end of the upload: the train shard and the metadata are missing. The dataset is not
    # prepared for any reader, and the rerun uploads exactly what is missing.
    version = f"{fresh_url}/digits/1.0.0"
    fs = remote.filesystem(version)
    for name in ("digits-train.array_record-00000-of-00001", "dataset_info.json"):
        fs.rm(f"{version}/{name}")
    with pytest.raises(datasets.DataNotFoundError, match="not prepared"):
        datasets.open_dataset("digits", data_dir=fresh_url, prepare=False)
    start = len(proxy.uploads)
    assert prepare.main(argv[:-2] + ["--no-verify"]) == 0
    names = uploads(proxy, start)
    assert names == ["digits-train.array_record-00000-of-00001", "features.json", "dataset_info.json"]
    assert "3 files" in capsys.readouterr().out and not (tmp_path / "staging").exists()
    ds = datasets.open_dataset("digits", data_dir=fresh_url, prepare=False)
    assert ds.num_examples("train") == 1437 and ds.source("train")[1436]["label"] >= 0
    assert prepare.main(argv) == 0 and "prepared in" in capsys.readouterr().out  # nothing left to do


def test_prepare_data_into_a_missing_bucket_is_one_line(capsys):
    assert prepare.main(["digits", "--data-dir", "gs://no-such-bucket/tfds"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("prepare-data: data_dir gs://no-such-bucket/tfds: bucket gs://no-such-bucket does not exist (or "
                   "this account cannot see it)")


def test_metrics_in_a_bucket_are_flushed_whole_and_a_resume_drops_the_lost_steps(fresh_url, proxy):
    run = f"{fresh_url}/run"
    w = MetricWriter(run, enabled=True, flush_interval_s=3600)
    start = len(proxy.log)
    for step in (10, 20, 30, 40):
        w.write(step, {"train/loss": 1.0 / step})
    assert len(proxy.log) == start  # nothing written per line: a bucket has no append
    w.flush()
    assert [r["step"] for r in read_jsonl(f"{run}/metrics.jsonl")] == [10, 20, 30, 40]
    events = remote.listdir(f"{run}/tb")
    assert len(events) == 1 and events[0].startswith("events.out.tfevents")
    w.close()
    # Killed after step 40 with the last checkpoint at 20: the rerun trains 21..40 again.
    w = MetricWriter(run, enabled=True, resume_step=20, flush_interval_s=0)  # flush at every write
    assert [r["step"] for r in read_jsonl(f"{run}/metrics.jsonl")] == [10, 20]
    w.write(30, {"train/loss": 2.0 / 30})
    assert read_jsonl(f"{run}/metrics.jsonl")[-1] == {"step": 30, "train/loss": 2.0 / 30}
    w.write(40, {"train/loss": float("nan")})
    w.close()
    rows = read_jsonl(f"{run}/metrics.jsonl")
    assert [r["step"] for r in rows] == [10, 20, 30, 40] and rows[-1]["train/loss"] == "nan"
    assert len(remote.listdir(f"{run}/tb")) == 2  # one events file per segment, as TensorBoard expects
    assert all(json.dumps(r) for r in rows)
