"""Every run of the shipped sweeps gives a command line that the trainer accepts as a valid config."""

import json
import subprocess
import sys

import pytest

from tests.train.helpers import ROOT, apply_overrides, env
from tests.train.test_shipped_configs import load
from vit_jax.main import check_override_keys
from vit_jax.sweep.spec import load_sweep
from vit_jax.train.config import validate

# Parses trainer arguments exactly as `python -m vit_jax.main` does (absl + ml_collections config_flags, which only
# registers override flags on the global FLAGS: hence a fresh process) and prints the resolved config.
PARSE = """
import json, sys
from absl import flags
from vit_jax import main
flags.FLAGS(["vit_jax.main", *sys.argv[1:]])
print(json.dumps(main._CONFIG.value.to_dict(), default=list))
"""

SWEEPS = ["configs/sweeps/demo_scaling.py", "configs/sweeps/paper_scaling.py",
          "configs/sweeps/finetune_lr.py:imagenet2012,/ckpt.npz", "configs/sweeps/finetune_lr.py:oxford_iiit_pet,"]


@pytest.mark.parametrize("spec", SWEEPS)
def test_every_sweep_run_is_a_valid_config(spec, monkeypatch):
    monkeypatch.chdir(ROOT)
    sweep = load_sweep(spec)
    assert sweep.runs
    base_path, _, base_arg = sweep.base.partition(":")
    for run in sweep.runs:
        args = run.trainer_args(sweep.base, "/tmp/unused")
        check_override_keys(args)
        validate(apply_overrides(load(base_path.rsplit("/", 1)[-1][:-3]).get_config(base_arg or None), run.all_overrides))
    # The first run's command line, through the real flag parser.
    args = sweep.runs[0].trainer_args(sweep.base, "/tmp/unused")
    out = subprocess.run([sys.executable, "-c", PARSE, *args], env=env(), cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    for key, value in sweep.runs[0].all_overrides.items():
        node = parsed
        for part in key.split("."):
            node = node[part]
        assert node == (list(value) if isinstance(value, (list, tuple)) else value), key
    if "imagenet2012" in spec:
        assert sorted(r.overrides["optimizer.lr"] for r in sweep.runs) == [0.003, 0.01, 0.03, 0.06]
