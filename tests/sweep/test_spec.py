"""Sweep definitions: grid expansion, run naming, overrides on the command line."""

import re

import pytest

from vit_jax.sweep.spec import expand, format_value, load_sweep, safe_name, split_arg

SAFE = re.compile(r"^[A-Za-z0-9._=,+-]+$")


def test_grid_is_the_cartesian_product_with_sorted_readable_names():
    sweep = expand({"base": "configs/demo.py",
                    "grid": {"total_epochs": [7, 14], "model.variant": ["S/16", "R50+B/16"]}})
    assert [r.name for r in sweep.runs] == [
        "model.variant=S-16,total_epochs=7", "model.variant=R50+B-16,total_epochs=7",
        "model.variant=S-16,total_epochs=14", "model.variant=R50+B-16,total_epochs=14"]
    assert sweep.runs[1].overrides == {"total_epochs": 7, "model.variant": "R50+B/16"}


def test_names_are_deterministic_unique_and_safe():
    definition = {"base": "b.py", "fixed": {"seed": 0},
                  "grid": {"optimizer.lr": [1e-3, 3e-4, 1e-05], "data.fraction": [0.5, 1.0],
                           "model.variant": ["B/16", "L/16 x", "H/14;rm -rf"]}}
    names = [r.name for r in expand(definition).runs]
    assert names == [r.name for r in expand(dict(definition)).runs]  # same definition, same names
    assert len(set(names)) == len(names) == 18
    assert all(SAFE.match(n) and not n.startswith(".") for n in names)
    assert "data.fraction=0.5,model.variant=L-16-x,optimizer.lr=0.0003" in names
    assert all("seed" not in n for n in names)  # fixed overrides do not name runs


def test_runs_list_crossed_with_grid_and_fixed_overrides():
    sweep = expand({"base": "b.py", "fixed": {"seed": 1, "optimizer.lr": 0.1},
                    "runs": [{"model.variant": "B/32", "optimizer": {"lr": 8e-4}}, {"model.variant": "L/16"}],
                    "grid": {"total_epochs": [7, 14]}})
    assert len(sweep.runs) == 4
    first = sweep.runs[0]
    assert first.name == "model.variant=B-32,optimizer.lr=0.0008,total_epochs=7"
    # the run's own value wins over the sweep-wide one
    assert first.all_overrides == {"seed": 1, "optimizer.lr": 8e-4, "model.variant": "B/32", "total_epochs": 7}
    assert sweep.runs[2].all_overrides["optimizer.lr"] == 0.1
    args = first.trainer_args("configs/x.py:arg", "/r/run")
    assert args[:2] == ["--config=configs/x.py:arg", "--workdir=/r/run"]
    assert "--config.optimizer.lr=0.0008" in args and "--config.model.variant=B/32" in args


def test_labelled_groups_name_runs_by_label():
    sweep = expand({"base": "b.py",
                    "grid": {"model": {"tiny": {"model.width": 32, "model.depth": 2}, "small": {"model.width": 64}},
                             "total_steps": [100]},
                    "runs": {"adam": {"optimizer.name": "adam"}}})
    assert [r.name for r in sweep.runs] == ["adam,model=tiny,total_steps=100", "adam,model=small,total_steps=100"]
    assert sweep.runs[0].overrides == {"optimizer.name": "adam", "model.width": 32, "model.depth": 2,
                                       "total_steps": 100}


def test_colliding_names_and_bad_definitions_are_clear_errors():
    with pytest.raises(ValueError, match="both get the name"):
        expand({"base": "b.py", "grid": {"model.variant": ["S/16", "S-16"]}})
    with pytest.raises(ValueError, match="set by both"):
        expand({"base": "b.py", "runs": [{"seed": 1}], "grid": {"seed": [2]}})
    with pytest.raises(ValueError, match="needs a 'base'"):
        expand({"grid": {"seed": [1]}})
    with pytest.raises(ValueError, match="unknown sweep entries"):
        expand({"base": "b.py", "grdi": {}})
    with pytest.raises(ValueError, match="must be a list"):
        expand({"base": "b.py", "grid": {"seed": 3}})
    # the same run listed twice is run once
    assert len(expand({"base": "b.py", "runs": [{"seed": 1}, {"seed": 1}]}).runs) == 1


def test_value_formatting_and_long_names():
    assert [format_value(v) for v in (True, 1e-05, 0.001, 7, "B/16", (224, 224), [3], ("a", "b"), None)] == [
        "true", "1e-05", "0.001", "7", "B/16", "(224,224)", "(3,)", "('a','b')", "None"]
    assert expand({"base": "b.py", "grid": {"eval.fewshot.shots": [(1, 5), (10,)]}}).runs[0].name == \
        "eval.fewshot.shots=1-5"
    long = safe_name("x=" + "a" * 400)
    assert len(long) <= 180 and long != safe_name("x=" + "a" * 399)
    assert split_arg("configs/a.py:b16,i21k") == ("configs/a.py", "b16,i21k")
    assert split_arg("a.py") == ("a.py", None)


def test_load_sweep_file_with_argument(tmp_path):
    (tmp_path / "base.py").write_text("def get_config(): pass\n")
    (tmp_path / "s.py").write_text(
        "def get_sweep(arg='1,2'):\n"
        "    return {'base': 'base.py:quick', 'grid': {'seed': [int(s) for s in arg.split(',')]}}\n")
    sweep = load_sweep(f"{tmp_path}/s.py:3,4,5")
    assert [r.name for r in sweep.runs] == ["seed=3", "seed=4", "seed=5"]
    # the base path is found next to the sweep file and made absolute, its argument kept
    assert sweep.base == f"{tmp_path}/base.py:quick"
    with pytest.raises(FileNotFoundError, match="not found"):
        load_sweep(f"{tmp_path}/missing.py")


@pytest.mark.parametrize("path", ["configs/sweeps/demo_scaling.py", "configs/sweeps/paper_scaling.py"])
def test_shipped_sweeps_expand(path):
    definition = __import__("runpy").run_path(path)["get_sweep"]()
    sweep = expand(definition, source=path)
    assert len(sweep.runs) >= 6 and len({r.name for r in sweep.runs}) == len(sweep.runs)


def test_config_args_become_arguments_of_the_base_config_file():
    sweep = expand({"base": "configs/vit_i21k.py:loss=softmax", "fixed": {"model.dropout": 0.0},
                    "runs": {"big": {"config_args": "variant=L/16", "optimizer.lr": 4e-4},
                             "small": {"config_args": {"variant": "B/32", "epochs": 7}}}})
    big, small = sweep.runs
    assert (big.name, small.name) == ("big", "small")
    assert big.trainer_args(sweep.base, "/w") == [
        "--config=configs/vit_i21k.py:loss=softmax,variant=L/16", "--workdir=/w",
        "--config.model.dropout=0.0", "--config.optimizer.lr=0.0004"]
    assert small.config(sweep.base) == "configs/vit_i21k.py:loss=softmax,variant=B/32,epochs=7"
    assert small.config_overrides == {"model.dropout": 0.0}
    # Without config_args the base's argument is passed through whatever its syntax.
    plain = expand({"base": "configs/finetune.py:cifar10", "grid": {"seed": [1]}}).runs[0]
    assert plain.trainer_args("configs/finetune.py:cifar10", "/w")[0] == "--config=configs/finetune.py:cifar10"
    with pytest.raises(ValueError, match="name=value"):
        big.config("configs/finetune.py:cifar10")


def test_finetune_grid_over_every_finished_run_of_a_pretraining_root(tmp_path, monkeypatch):
    import json

    from tests.train.helpers import ROOT

    monkeypatch.chdir(ROOT)
    root = tmp_path / "paper_scaling"
    root.mkdir()
    (root / "sweep.json").write_text("{}")
    for name, variant, status in (("ViT-B-16,total_epochs=7", "B/16", "finished"),
                                  ("R50+ViT-B-16,total_epochs=7", "R50+B/16", "finished"),
                                  ("ViT-H-14,total_epochs=14", "H/14", "preempted")):
        (root / name).mkdir()
        (root / name / "summary.json").write_text(json.dumps({"status": status, "model": {"variant": variant}}))
    sweep = load_sweep(f"configs/sweeps/finetune_lr.py:cifar100,{root}")
    assert len(sweep.runs) == 2 * 4  # the two finished runs x the paper's lr grid
    run = next(r for r in sweep.runs if r.name.startswith("R50+ViT-B-16") and r.overrides["optimizer.lr"] == 0.01)
    assert run.overrides["model.variant"] == "R50+B/16"
    assert run.overrides["init.checkpoint"] == str(root / "R50+ViT-B-16,total_epochs=7")
    assert run.trainer_args(sweep.base, "/w")[0].endswith("configs/finetune.py:dataset=cifar100")
