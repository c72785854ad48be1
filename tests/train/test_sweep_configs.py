"""Every run of the shipped sweeps gives a command line that the trainer accepts as a valid config."""

import json
import subprocess
import sys

import pytest

from tests.train.helpers import ROOT, apply_overrides, env
from tests.train.test_shipped_configs import load
from vit_jax.sweep.spec import load_sweep
from vit_jax.train.config import check_override_keys
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

SWEEPS = ["configs/sweeps/demo_scaling.py", "configs/sweeps/paper_scaling.py", "configs/sweeps/data_fraction.py",
          "configs/sweeps/finetune_lr.py:imagenet2012,/ckpt.npz", "configs/sweeps/finetune_lr.py:oxford_iiit_pet,"]


def resolved(sweep, run):
    """The config a run trains with: its config file called with its arguments, then its overrides."""
    base_path, _, base_arg = run.config(sweep.base).partition(":")
    return apply_overrides(load(base_path.rsplit("/", 1)[-1][:-3]).get_config(base_arg or None), run.config_overrides)


def test_paper_sweep_sizes_every_model_from_its_own_variant(monkeypatch):
    """vit_i21k derives the pre-logits size, scan/remat, FSDP and the first-moment dtype from its `variant`
    argument: each run must get its own model's values, not the base variant's. Its BiT ResNets get none of the
    ViT options (which would be a config error for them) and build as BiT ResNets."""
    from vit_jax.models import parse_variant
    from vit_jax.models.bit_config import BiTConfig, is_bit_name
    from vit_jax.train.config import model_config

    monkeypatch.chdir(ROOT)
    sweep = load_sweep("configs/sweeps/paper_scaling.py")
    seen = set()
    for run in sweep.runs:
        c = resolved(sweep, run)
        variant = c.model.variant
        seen.add(variant)
        if is_bit_name(variant):
            cfg = model_config(c, 21843)
            assert isinstance(cfg, BiTConfig) and cfg.name == variant and cfg.dtype == "bfloat16", run.name
            assert not c.model.scan and c.mesh.fsdp == 1 and c.optimizer.name == "adamw", run.name
            continue
        assert c.model.rep_size == parse_variant(variant)["width"], run.name
        deep = variant.split("+")[-1][0] in "LH"
        assert c.model.scan == deep and c.mesh.fsdp == (8 if deep else 1), run.name
        assert c.optimizer.mu_dtype == ("bfloat16" if variant.startswith("H/") else "float32"), run.name
    assert {"B/32", "B/16", "L/32", "L/16", "H/14", "R50+B/16", "R50+L/16"} <= seen
    # Table 6's ResNet rows, each at 7 and 14 epochs.
    bits = {"BiT-R50x1", "BiT-R50x2", "BiT-R101x1", "BiT-R152x1", "BiT-R152x2", "BiT-R200x3"}
    assert bits <= seen
    assert sorted((r.config(sweep.base).split("variant=")[1], r.overrides["total_epochs"]) for r in sweep.runs
                  if "BiT" in r.name) == sorted((b, e) for b in bits for e in (7, 14))


@pytest.mark.parametrize("spec", SWEEPS)
def test_every_sweep_run_is_a_valid_config(spec, monkeypatch):
    monkeypatch.chdir(ROOT)
    sweep = load_sweep(spec)
    assert sweep.runs
    for run in sweep.runs:
        args = run.trainer_args(sweep.base, "/tmp/unused")
        check_override_keys(args)
        validate(resolved(sweep, run))
    # The last run's command line (the biggest model of the paper grid), through the real flag parser.
    run = sweep.runs[-1]
    args = run.trainer_args(sweep.base, "/tmp/unused")
    out = subprocess.run([sys.executable, "-c", PARSE, *args], env=env(), cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    assert parsed == json.loads(json.dumps(resolved(sweep, run).to_dict(), default=list))
    for key, value in run.config_overrides.items():
        node = parsed
        for part in key.split("."):
            node = node[part]
        assert node == (list(value) if isinstance(value, (list, tuple)) else value), key
    if "imagenet2012" in spec:
        assert sorted(r.overrides["optimizer.lr"] for r in sweep.runs) == [0.003, 0.01, 0.03, 0.06]
