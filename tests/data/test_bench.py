"""`vit-jax bench data` runs end to end on a few images and reports every number the docs quote."""

import json

from vit_jax.bench import data as bench
from vit_jax.data import sources


def test_data_bench_smoke(capsys):
    args = ["--num-images", "8", "--batch", "4", "--steps", "2", "--repeats", "1", "--size", "32", "--workers",
            "1,2", "--no-device", "--stages", "--json"]
    assert bench.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(r["workers"], r["to_device"]) for r in result["ours"]] == [(1, False), (2, False)]
    for r in result["ours"] + [result["tensorflow"], result["tensorflow_per_call"]]:
        assert r["images"] > 0 and r["images_per_cpu_s"] > 0 and r["images_per_s"] > 0
    assert result["ratio_per_core"] > 0 and result["scaling_2_workers_wall"] > 0
    assert set(result["stages"]) == {"ours_ms", "tensorflow_ms", "dct_scales"}
    assert all(ms > 0 for ms in result["stages"]["ours_ms"].values())
    assert sources.CACHE_BYTES == 64 << 20  # measured as ImageNet reads (uncached), and the setting is restored


def test_data_bench_json_file_like_the_other_benchmarks(tmp_path, capsys):
    out = tmp_path / "data.json"
    args = ["--num-images", "8", "--batch", "2", "--steps", "1", "--repeats", "1", "--size", "32", "--workers", "1",
            "--no-device", "--no-per-call", "--json", str(out)]
    assert bench.main(args) == 0
    assert json.loads(out.read_text())["ratio_per_core"] > 0
    assert "(c) ratio per core" in capsys.readouterr().out  # the table is still printed
