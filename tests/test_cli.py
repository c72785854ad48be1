"""The `vit-jax` entry point: every subcommand resolves to a module with a `main`, and --help is a real page."""

import importlib
import json
import subprocess
import sys

import numpy as np
import pytest

from vit_jax import cli, cli_args

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


# Every argparse command and sub-command (train is absl's: --config, --workdir, --config.KEY=VALUE).
HELP_PAGES = [[name] for name in cli.COMMANDS if name not in ("train", "bench", "sweep")] + [
    ["bench", "data"], ["bench", "data", "--remote"], ["bench", "train"], ["bench", "eval"],
    ["sweep", "run"], ["sweep", "status"], ["sweep", "report"], ["sweep", "suggest"]]


def test_every_commands_flags_are_in_one_style(capsys):
    import re

    pages = {}

    for page in HELP_PAGES:
        with pytest.raises(SystemExit) as e:
            cli.main([*page, "--help"])
        assert e.value.code == 0, page
        options = set(re.findall(r"(?<![\w.])--[\w-]+", capsys.readouterr().out))
        assert options, page
        assert not [o for o in options if "_" in o], f"vit-jax {' '.join(page)}: {sorted(options)}"
        # One name per concept (#41): the replaced spellings appear on no page.
        assert not options & set(cli_args.DEPRECATED), f"vit-jax {' '.join(page)}: {sorted(options)}"
        pages[" ".join(page)] = options
    assert {"--checkpoint", "--output", "--to"} <= pages["convert"]
    for page in ("eval", "analyze", "predict", "plan", "bench train", "bench eval", "bench data", "sweep report"):
        assert "--output" in pages[page], page  # where results go
    for page in ("plan", "bench train", "bench eval", "bench data", "bench data --remote"):
        assert {"--batch-size", "--image-size"} <= pages[page], page


def test_old_spellings_of_renamed_flags_still_work_and_name_the_new_one(capsys, tmp_path):
    from vit_jax.bench import data as bench_data

    p = cli_args.ArgumentParser(prog="vit-jax x")
    p.add_argument("--batch-size", dest="batch", type=int)
    p.add_argument("--output", dest="json")
    assert vars(p.parse_args(["--batch", "8", "--json=r.json"])) == {"batch": 8, "json": "r.json"}
    assert capsys.readouterr().err.splitlines() == ["vit-jax x: --batch is deprecated; use --batch-size",
                                                    "vit-jax x: --json is deprecated; use --output"]
    with pytest.raises(SystemExit):  # only where the command has the new option
        cli_args.ArgumentParser().parse_args(["--batch", "8"])
    assert bench_data.main(["--num-images", "8", "--batch", "2", "--steps", "1", "--repeats", "1", "--size", "16",
                            "--workers", "1", "--no-device", "--no-per-call", "--json", str(tmp_path / "o.json")]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["batch"] == 2
    assert cli.main(["convert", "/nowhere.npz", str(tmp_path / "x.npz"), "--to", "official"]) == 2
    assert "SRC DST as positional arguments is deprecated; use --checkpoint SRC --output DST" in capsys.readouterr().err


def test_old_underscore_spellings_still_work():
    from vit_jax import cli_args
    from vit_jax.commands import prepare_data

    args = prepare_data.parse_args(["digits", "--data_dir", "/d", "--no_verify", "--show_classes=3"])
    assert (args.data_dir, args.no_verify, args.show_classes) == ("/d", True, 3)
    p = cli_args.ArgumentParser()
    p.add_argument("--top-k")
    p.add_argument("rest", nargs="*")
    assert vars(p.parse_args(["--top_k=2", "--", "--top_k"])) == {"top_k": "2", "rest": ["--top_k"]}
    with pytest.raises(SystemExit):  # only spellings of real options are rewritten
        p.parse_args(["--top_kk=2"])


def test_unknown_command_suggests_the_closest(capsys):
    assert cli.main(["plna"]) == 2
    assert "did you mean 'plan'" in capsys.readouterr().err


def test_unreadable_checkpoints_are_one_line_errors_with_exit_2(tmp_path, capsys, monkeypatch):
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, params=np.array([{"a": 1}], dtype=object))  # an object array: loading it would unpickle
    truncated = tmp_path / "truncated.npz"
    np.savez(truncated, x=np.zeros(1000))
    truncated.write_bytes(truncated.read_bytes()[:300])
    cases = {
        pickled: "holds pickled Python objects, which vit_jax never loads",
        truncated: "is not a readable .npz of arrays",
        tmp_path / "missing.npz": "does not exist",
    }
    for path, message in cases.items():
        assert cli.main(["convert", "--checkpoint", str(path), "--output", str(tmp_path / "out.npz"), "--to", "official"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"vit-jax convert: error: ") and message in err[0], err
    monkeypatch.setenv("VIT_JAX_DEBUG", "1")
    assert cli.main(["convert", "--checkpoint", str(pickled), "--output", str(tmp_path / "out.npz"), "--to", "official"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_verbose_is_shared_by_every_command_and_turns_on_tracebacks(monkeypatch):
    from vit_jax import cli_args
    from vit_jax.errors import DEBUG_ENV, debug_enabled

    monkeypatch.setenv(DEBUG_ENV, "0")
    p = cli_args.ArgumentParser()
    p.add_argument("--top-k")
    assert vars(p.parse_args(["--top-k=2"])) == {"top_k": "2"} and not debug_enabled()
    assert vars(p.parse_args(["--verbose", "--top-k=2"])) == {"top_k": "2"}  # a switch, not a command's option
    assert debug_enabled()
