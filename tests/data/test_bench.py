"""`vit-jax bench data` runs end to end on a few images and reports every number the docs quote."""

import json

from vit_jax.bench import data as bench
from vit_jax.data import sources


def test_data_bench_smoke(capsys):
    args = ["--num-images", "8", "--batch-size", "4", "--steps", "2", "--repeats", "1", "--image-size", "32",
            "--workers",
            "1,2", "--no-device", "--stages", "--output"]
    assert bench.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(r["workers"], r["to_device"]) for r in result["ours"]] == [(1, False), (2, False)]
    for r in result["ours"] + [result["tensorflow"], result["tensorflow_from_memory"], result["tensorflow_per_call"]]:
        assert r["images"] > 0 and r["images_per_cpu_s"] > 0 and r["images_per_s"] > 0
    assert result["ratio_per_core"] > 0 and result["ratio_per_core_vs_memory"] > 0
    assert result["scaling_2_workers_wall"] > 0
    assert set(result["stages"]) == {"ours_ms", "tensorflow_ms", "dct_scales"}
    assert all(ms > 0 for ms in result["stages"]["ours_ms"].values())
    assert sources.CACHE_BYTES == 64 << 20  # measured as ImageNet reads (uncached), and the setting is restored


def test_data_bench_json_file_like_the_other_benchmarks(tmp_path, capsys):
    out = tmp_path / "data.json"
    args = ["--num-images", "8", "--batch-size", "2", "--steps", "1", "--repeats", "1", "--image-size", "32",
            "--workers", "1",
            "--no-device", "--no-per-call", "--output", str(out)]
    assert bench.main(args) == 0
    assert json.loads(out.read_text())["ratio_per_core"] > 0
    assert "(c) ratio per core" in capsys.readouterr().out  # the table is still printed


def test_the_tensorflow_reference_reads_the_records_into_the_same_batches(tmp_path, gen):
    # (b) reads and parses the serialized records, (b-mem) takes the JPEGs from memory: the same images, boxes and
    # flips in the same order, so the two do the same image work and differ only by the read and the parse.
    import numpy as np

    from vit_jax.data import features

    feats = features.image_features(["a", "b", "c"])
    records = [feats.serialize_example({"image": gen.encode(gen.photo(40 + 8 * i, 48, seed=i)), "label": i % 3,
                                        "labels": [i % 3], "id": f"{i}.jpg"}) for i in range(6)]
    reference = bench.TensorflowReference(records, 16, 4, tmp_path / "train.tfrecord")
    for _ in range(3):  # wraps around the 6 records
        np.testing.assert_array_equal(next(reference._iterator("records")).numpy(),
                                      next(reference._iterator("all")).numpy())
