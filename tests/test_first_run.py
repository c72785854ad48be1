"""First runs, on a machine with empty caches (HOME and XDG_CACHE_HOME pointing at empty folders), as real
subprocesses: a mistake in the command is its one error line, with nothing built or printed before it; a dataset
built on first use says so in one line instead of TFDS's page of build output (#49)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def fresh_machine(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a user's first run: empty home and cache folders, none of our or TFDS's cache settings."""
    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    cache.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VIT_JAX_CACHE_DIR", "TFDS_DATA_DIR", "VIT_JAX_DEBUG")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT))
    return env, home


def output_lines(command: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    out = subprocess.run(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=300)
    return out.returncode, out.stdout.splitlines()


@pytest.mark.parametrize("workdir", [False, True], ids=["no workdir", "workdir"])
def test_a_bad_model_variant_on_a_fresh_machine_is_one_line_and_nothing_else(tmp_path, workdir):
    env, home = fresh_machine(tmp_path)
    command = [sys.executable, "-m", "vit_jax.main", "--config=configs/demo.py", "--config.model.variant=B/17x"]
    code, lines = output_lines(command + ([f"--workdir={tmp_path / 'run'}"] if workdir else []), env)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("vit-jax train: error: unknown ViT variant 'B/17x': expected e.g. 'Ti/16'"), lines
    # Checked before any work: no dataset built, no compilation cache, no workdir.
    assert not list(home.iterdir()) and not (tmp_path / "run").exists()


def test_a_missing_workdir_is_one_line(tmp_path):
    env, _ = fresh_machine(tmp_path)
    code, lines = output_lines([sys.executable, "-m", "vit_jax.main", "--config=configs/demo.py"], env)
    assert code == 2 and lines == ["vit-jax train: error: --workdir is required: the folder for checkpoints, metrics "
                                   "and summary.json (rerunning in the same folder resumes)"], lines


def test_a_dataset_built_on_first_use_says_so_in_one_line(tmp_path):
    env, home = fresh_machine(tmp_path)
    program = "from vit_jax.data import datasets; print(datasets.open_dataset('digits').num_examples('train'))"
    code, lines = output_lines([sys.executable, "-c", program], env)
    data_dir = home / "tensorflow_datasets"
    assert code == 0 and lines == [f"preparing dataset digits in {data_dir} (on first use only; `vit-jax prepare-data "
                                   "digits` shows the build)", "1437"], lines
    code, lines = output_lines([sys.executable, "-c", program], env)
    assert code == 0 and lines == ["1437"], lines  # prepared: nothing to say
