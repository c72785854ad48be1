"""The shipped scaling sweeps plan the paper's three families: `vit-jax sweep run --dry-run` lists their runs."""

import shlex

from tests.train.helpers import ROOT
from vit_jax.commands import sweep as cli


def planned(capsys, sweep: str, root) -> dict[str, list[str]]:
    """{run name: its trainer command line} from a dry run, which launches nothing."""
    assert cli.main(["run", sweep, "--root", str(root), "--dry-run"]) == 0
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines() if line and line[0] != "#"]
    out = {}
    for command in commands:
        workdir = next(a for a in command if a.startswith("--workdir="))
        out[workdir.rsplit("/", 1)[-1]] = command
    return out


def test_demo_sweep_has_small_vits_a_bit_resnet_and_a_hybrid(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    runs = planned(capsys, "configs/sweeps/demo_scaling.py", tmp_path / "demo")
    assert sorted(runs) == sorted([f"model={m},total_epochs={e}" for m in ("w32-d2", "w64-d4", "w128-d4")
                                   for e in (5, 15)] + ["model=BiT-R1-1x1,total_epochs=5",
                                                        "model=R1+w64-d2,total_epochs=5",
                                                        "model=Swin-32-2-2,total_epochs=5"])
    assert "--config.model.variant=BiT-R1-1x1" in runs["model=BiT-R1-1x1,total_epochs=5"]
    assert "--config.model.resnet_layers=(1,)" in runs["model=R1+w64-d2,total_epochs=5"]
    # One run per family beside ViT: evaluated ten times, so that its front has the points a scaling-law fit needs.
    assert "--config.model.variant=Swin-32-2-2" in runs["model=Swin-32-2-2,total_epochs=5"]
    for name in ("model=BiT-R1-1x1,total_epochs=5", "model=R1+w64-d2,total_epochs=5",
                 "model=Swin-32-2-2,total_epochs=5"):
        assert "--config.eval.every_epochs=0.5" in runs[name]
    assert "--config.eval.every_epochs=2.5" in runs["model=w32-d2,total_epochs=5"]


def test_paper_sweep_has_table6_resnets_at_7_and_14_epochs(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    runs = planned(capsys, "configs/sweeps/paper_scaling.py", tmp_path / "paper")
    bits = {name: command for name, command in runs.items() if "BiT" in name}
    assert len(runs) == 30 and len(bits) == 12
    for depth_width, lr in (("R50x1", 1e-3), ("R101x1", 8e-4), ("R200x3", 6e-4)):
        for epochs in (7, 14):
            command = bits[f"BiT-{depth_width},total_epochs={epochs}"]
            assert f"--config=configs/vit_i21k.py:variant=BiT-{depth_width}" in command
            assert f"--config.optimizer.lr={lr}" in command and f"--config.total_epochs={epochs}" in command


def test_data_fraction_sweep_gives_every_run_the_same_training_examples(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    runs = planned(capsys, "configs/sweeps/data_fraction.py", tmp_path / "fractions")
    # Five sizes per model: the fewest the report's scaling-law fit against training-set size takes.
    assert sorted(runs) == sorted(f"data.fraction={f},model={m}" for f in (0.05, 0.1, 0.3, 0.5, 1.0)
                                  for m in ("BiT-R1-1x1", "w128-d4"))
    for command in runs.values():
        assert "--config.total_examples=21555" in command and "--config.optimizer.warmup_examples=2874" in command
