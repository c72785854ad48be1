"""Two real JAX processes (CPU, gloo): each loads only its rows, and together they form the 1-process batch."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import portpicker

from vit_jax.data import pipeline

PP = "decode|inception_crop(32, area_min=30)|flip_lr|value_range(-1, 1)|onehot(10)"

WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    port, pid, data_dir, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from jax.sharding import NamedSharding, PartitionSpec as P
    from vit_jax.data import pipeline
    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    ds = pipeline.open_dataset("digits", data_dir=data_dir, prepare=False)
    it = pipeline.train_iterator(ds, pp=%r, global_batch_size=16, sharding=NamedSharding(mesh, P("data")), seed=4)
    rows = {}
    for step in range(2):
        batch = next(it)
        for shard in batch["image"].addressable_shards:
            rows.setdefault(step, {})[shard.index[0].start] = np.asarray(shard.data).tolist()
    json.dump({"lo_hi": [it.lo, it.hi], "rows": rows, "state": it.get_state()}, open(out, "w"))
    it.close()
    jax.distributed.shutdown()
""") % PP


def test_two_jax_processes_build_the_same_global_batches(digits_ds, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = portpicker.pick_unused_port()
    data_dir = str(Path(digits_ds.builder.data_dir_root))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, str(script), str(port), str(i), data_dir, str(tmp_path / f"{i}.json")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in (0, 1)]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out.decode()[-3000:]
    results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in (0, 1)]
    assert [r["lo_hi"] for r in results] == [[0, 8], [8, 16]]
    assert results[0]["state"] == results[1]["state"]

    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",))
    it = pipeline.train_iterator(digits_ds, pp=PP, global_batch_size=16, sharding=NamedSharding(mesh, P("data")), seed=4)
    for step in range(2):
        whole = np.asarray(next(it)["image"])
        shards = {int(k): np.asarray(v, np.float32) for r in results for k, v in r["rows"][str(step)].items()}
        stitched = np.concatenate([shards[k] for k in sorted(shards)])
        np.testing.assert_array_equal(stitched, whole)
    it.close()
