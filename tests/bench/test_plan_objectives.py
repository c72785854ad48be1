"""`vit-jax plan --topology` (the real TPU compiler, libtpu from the test extra) plans any objective from its config
file: the batch it compiles is the objective's own (train/objectives/ batch_spec), so a segmentation run's step reads
pixel labels and MAE's images only. (A BiT ResNet's plan from the model flags: tests/bench/test_aot_plan.py; from
configs/bit_i21k.py:variant=BiT-R1-1x1 it is the same program, checked by hand on 2026-12-06.)"""

import json
import subprocess
import sys

import pytest

from tests.launch.helpers import ROOT, job_env

pytestmark = pytest.mark.slow

PLANS = {  # name -> the config and its arguments; batch bytes per chip of v5e:2x2's 4 (data-parallel)
    "segmentation": (["--config", "configs/demo_seg.py"], 64 // 4 * 32 * 32 * (3 * 4 + 1)),  # + uint8 labels
    "mae": (["--config", "configs/demo_ssl.py", "--stage", "pretrain"], 128 // 4 * 16 * 16 * 3 * 4),
}


def test_plan_compiles_segmentation_and_mae_configs_for_a_v5e_slice(tmp_path):
    # Started together: most of each is a fresh interpreter importing JAX and libtpu, which overlap on 2 cores.
    procs = {name: subprocess.Popen([sys.executable, "-m", "vit_jax.bench.plan", "--topology", "v5e:2x2", *args,
                                     "--output", str(tmp_path / f"{name}.json")], cwd=ROOT, env=job_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, (args, _) in PLANS.items()}
    outputs = {name: proc.communicate(timeout=600)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name}: {outputs[name][-3000:]}"
    plans = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in PLANS}
    for name, (_, batch_bytes) in PLANS.items():
        plan = plans[name]
        assert plan["compiler"] == "tpu" and plan["fits"] and plan["eval"]["peak_bytes"] > 0, (name, plan)
        assert plan["batch_bytes_per_device"] == batch_bytes, (name, plan["batch_bytes_per_device"])
    assert plans["mae"]["model"].startswith("ViT") and plans["segmentation"]["model"].startswith("ViT")
