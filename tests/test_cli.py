"""The `vit-jax` entry point: every subcommand resolves to a module with a `main`, and --help is a real page."""

import importlib
import subprocess
import sys

import pytest

from vit_jax import cli

# What the README and the issues document as `vit-jax COMMAND`.
DOCUMENTED = ("train", "convert", "predict", "prepare-data", "bench", "plan", "eval", "sweep", "analyze")


def test_every_documented_command_is_registered_with_a_main():
    assert set(DOCUMENTED) <= set(cli.COMMANDS)
    for name, (module, help_text) in cli.COMMANDS.items():
        assert callable(importlib.import_module(module).main), name
        assert help_text


@pytest.mark.parametrize("name", ["plan", "bench", "sweep"])
def test_subcommand_help_runs(name):
    out = subprocess.run([sys.executable, "-m", "vit_jax.cli", name, "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower()


def test_unknown_command_suggests_the_closest(capsys):
    assert cli.main(["plna"]) == 2
    assert "did you mean 'plan'" in capsys.readouterr().err
