"""Shared helpers for the trainer tests: the demo config made tiny, and running the trainer as a subprocess."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from tests.launch.helpers import cache_dir
from vit_jax.train.stages import set_key

ROOT = Path(__file__).resolve().parents[2]


def demo_config(data_dir: str, **overrides):
    spec = importlib.util.spec_from_file_location("demo_config", ROOT / "configs" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.data.data_dir = data_dir
    c.total_epochs = 0.0
    c.total_steps = 12
    c.batch_size = 32
    c.log_every_steps = 1
    c.eval.every_epochs = 0.0
    c.checkpoint.every_epochs = 0.0
    c.optimizer.warmup_epochs = 0.0
    c.optimizer.warmup_steps = 2
    c.eval.fewshot.datasets = ()
    c.eval.fewshot.every_epochs = 0.0
    return apply_overrides(c, overrides)


def apply_overrides(config, overrides: dict):
    """Sets dotted keys (`"optimizer.lr": 0.1`) like `--config.optimizer.lr=0.1` does (stages.set_key)."""
    for key, value in overrides.items():
        set_key(config, key, value, "test overrides")
    return config


# The same tiny run as demo_config, as command-line overrides of configs/demo.py.
TINY_FLAGS = ["--config.total_epochs=0", "--config.batch_size=32", "--config.log_every_steps=1",
              "--config.eval.every_epochs=0", "--config.checkpoint.every_epochs=0", "--config.optimizer.warmup_epochs=0",
              "--config.optimizer.warmup_steps=2", "--config.eval.fewshot.datasets=()",
              "--config.eval.fewshot.every_epochs=0"]


def train_command(workdir, data_dir, *flags) -> list[str]:
    return [sys.executable, "-m", "vit_jax.main", f"--config={ROOT / 'configs' / 'demo.py'}", f"--workdir={workdir}",
            f"--config.data.data_dir={data_dir}", *TINY_FLAGS, *flags]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["VIT_JAX_CACHE_DIR"] = cache_dir()
    return e


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)
