"""The two seams, proven from outside the package: tests/seams_toy.py registers a toy model family and a toy
objective whose frozen teacher is extra model state, and with no edit in vit_jax/ the run trains on the 8-device CPU
mesh (data x fsdp x tensor), resumes bit for bit with its teacher restored, is evaluated by `vit-jax eval`, and is
planned by `vit-jax plan`."""

import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.launch.helpers import ROOT, job_env, losses
from vit_jax import cli
from vit_jax.checkpoints.training import load_state_from_run
from vit_jax.models.family import FAMILIES
from vit_jax.train.config import config_module, validate
from vit_jax.train.objectives import OBJECTIVES
from vit_jax.train.trainer import Trainer

TOY = ROOT / "tests" / "seams_toy.py"


@pytest.fixture(scope="module", autouse=True)
def toy():
    """The toy family and objective, registered for this module's tests only (a registry is process-wide: the
    config schema of tests run later in this process must not grow a `toy_distillation` group)."""
    yield config_module(TOY)  # registers the family "Toy" and the objective "toy_distillation"
    FAMILIES.pop("Toy")
    OBJECTIVES.pop("toy_distillation")


def toy_config(data_dir, **changes):
    c = config_module(TOY).get_config()
    c.data.data_dir = data_dir
    c.update(changes)
    validate(c)
    return c


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory, digits_data_dir):
    workdir = tmp_path_factory.mktemp("toy") / "run"
    summary = Trainer(toy_config(digits_data_dir), str(workdir)).train()
    return workdir, summary


def test_a_registered_family_and_objective_train_on_the_8_device_mesh(toy_run):
    workdir, summary = toy_run
    assert summary["steps"] == 4 and summary["skipped_steps"] == 0
    assert summary["model"]["family"] == "Toy" and summary["model"]["name"] == "toy-16"
    assert summary["compute"]["train_flops_per_image"] == 3 * 2.0 * (192 * 16 + 16 * 10)
    logged = losses(workdir)
    assert sorted(logged) == [1, 2, 3, 4] and logged[4] < logged[1]  # the student moves toward its teacher
    final = summary["final"]
    assert final["eval/count"] == 360 and 0 <= final["eval/agreement"] <= 1
    assert summary["best"]["eval/agreement"] == max(final["eval/agreement"], summary["best"]["eval/agreement"])
    meta = json.loads((workdir / "checkpoints" / "4" / "meta" / "metadata").read_text())
    assert meta["model_family"] == "Toy" and meta["config"]["objective"] == "toy_distillation"


def test_the_teacher_is_sharded_saved_restored_and_frozen(toy_run, tmp_path, digits_data_dir):
    full, _ = toy_run
    shutil.copytree(full / "checkpoints" / "2", tmp_path / "checkpoints" / "2")
    trainer = Trainer(toy_config(digits_data_dir), str(tmp_path))
    assert trainer.start_step == 2
    kernel = trainer.state["extra"]["teacher"]["kernel"]
    assert tuple(kernel.sharding.spec) == ("fsdp", "tensor")  # the logical axes ("embed", "vocab") on the mesh
    trainer.train()
    assert losses(tmp_path) == {k: v for k, v in losses(full).items() if k > 2}  # bit-identical steps 3-4
    shapes = {"params": trainer.program.model.shapes, "extra": jax.eval_shape(lambda: trainer.state["extra"])}
    _, first = load_state_from_run(str(full / "checkpoints" / "2"), shapes)
    _, last = load_state_from_run(str(full), shapes)
    np.testing.assert_array_equal(first["extra"]["teacher"]["kernel"], last["extra"]["teacher"]["kernel"])
    assert not np.array_equal(first["params"]["hidden"]["kernel"], last["params"]["hidden"]["kernel"])


def test_vit_jax_eval_of_the_toy_run_is_its_objectives_evaluation(toy_run, tmp_path, capsys):
    workdir, summary = toy_run
    out = tmp_path / "eval.json"
    assert cli.main(["eval", "--checkpoint", str(workdir), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "toy-16 (a toy: 16 tanh units, classes=10), trained by objective 'toy_distillation'" in printed
    assert "digits/test: agreement" in printed
    assert json.loads(out.read_text()) == {k: pytest.approx(v, abs=1e-9) for k, v in summary["final"].items()}


def test_vit_jax_plan_plans_the_toy_run_from_its_config_file(tmp_path):
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "vit_jax.bench.plan", "--config", str(TOY), "--devices", "8",
                        "--output", str(out)], capture_output=True, text=True, env=job_env(), cwd=tmp_path,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    plan = json.loads(out.read_text())
    assert plan["model"] == "toy-16" and plan["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    assert plan["peak_bytes"] > 0 and plan["saved_activation_bytes"] > 0
    assert plan["batch_bytes_per_device"] == 32 // 4 * 8 * 8 * 3 * 4  # the objective's batch: images only
