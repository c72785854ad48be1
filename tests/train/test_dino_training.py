"""DINO through the real trainer (8 simulated devices): a run on a data x fsdp mesh with its EMA teacher, centres
and multi-crop batch, its own evaluation and the few-shot probe; exact resume from a mid-run checkpoint (teacher and
centres included); the encoder loading into a classifier.

One tiny run serves all (compiling the step is most of the time): 32 px digits in 8 px patches, width 32, depth 1,
a 64-prototype head, 2 global + 1 local 16 px crops (crops and flips: the colour augmentations are
tested in tests/models/test_dino.py, and cost compile time here), iBOT and KoLeo on.
"""

import json
import shutil

import jax
import numpy as np
import pytest

from tests.launch.helpers import losses
from tests.train.helpers import demo_config
from vit_jax import cli
from vit_jax.checkpoints.training import load_params_from_run, load_state_from_run
from vit_jax.train.objectives.dino import cosine_momentum
from vit_jax.train.trainer import Trainer

pytestmark = pytest.mark.slow

STEPS = 4


def dino_config(data_dir, **overrides):
    return demo_config(data_dir, **{
        "objective": "dino", "total_steps": STEPS, "batch_size": 16,
        "model.width": 32, "model.depth": 1, "model.mlp_dim": 64, "model.num_heads": 2, "model.patch_size": 8,
        "model.image_size": 32, "model.pool": "token",
        "data.pp_train": "decode|resize(32)|value_range(-1,1)", "data.pp_eval": "decode|resize(32)|value_range(-1,1)",
        "loss.label_smoothing": 0.0,
        "dino.head_hidden": 64, "dino.head_bottleneck": 16, "dino.prototypes": 64, "dino.local_crops": 1,
        "dino.local_crop_size": 16, "dino.momentum_start": 0.9, "dino.augment": False,
        "eval.evaluators": ("dino", "fewshot"), "eval.batch_size": 120,
        "mesh.data": 2, "mesh.fsdp": 4, "mesh.tensor": 1, **overrides})


@pytest.fixture(scope="module")
def dino_run(tmp_path_factory, digits_data_dir):
    workdir = tmp_path_factory.mktemp("dino") / "run"
    c = dino_config(digits_data_dir, **{"checkpoint.every_steps": 1, "eval.fewshot.datasets": ("digits",),
                                        "eval.fewshot.shots": (5,), "eval.fewshot.seeds": 1,
                                        "eval.fewshot.max_train_examples": 200,
                                        "eval.fewshot.max_test_examples": 120, "eval.fewshot.knn": (10, 20)})
    trainer = Trainer(c, str(workdir))
    summary = trainer.train()
    return workdir, trainer, summary


def state_at(trainer, path):
    """The params and extra state (teacher, centres, step) of a checkpoint, on the host."""
    shapes = {"params": trainer.program.model.shapes, "extra": trainer.program.objective.extra_shapes()}
    return load_state_from_run(str(path), shapes)[1]


def test_dino_trains_on_a_data_fsdp_mesh_and_evaluates(dino_run):
    workdir, trainer, summary = dino_run
    assert summary["status"] == "finished" and summary["steps"] == STEPS and summary["skipped_steps"] == 0
    logged = losses(workdir)
    assert sorted(logged) == list(range(1, STEPS + 1)) and all(np.isfinite(list(logged.values())))
    final = summary["final"]
    assert final["eval/count"] == 360 and np.isfinite(final["eval/dino_loss"])
    assert 0 < final["eval/teacher_entropy"] <= np.log(64) + 1e-4
    assert "fewshot/digits/5shot" in final
    assert 0.1 < final["knn/digits/10nn"] <= 1 and 0.1 < final["knn/digits/20nn"] <= 1  # above chance already
    teacher = trainer.state["extra"]["teacher"]
    pairs = list(zip(jax.tree.leaves(teacher), jax.tree.leaves(trainer.state["params"])))
    assert all(t.sharding == p.sharding for t, p in pairs)  # sharded as the student ...
    assert any("fsdp" in t.sharding.spec for t, _ in pairs)  # ... over the fsdp axis
    # The encoder alone loads as a plain ViT (head, mask token and teacher left out), ready to fine-tune.
    _, encoder = load_params_from_run(str(workdir))
    assert "dino_head" not in encoder and "mask_token" not in encoder and "cls" in encoder


def test_the_teacher_is_the_exact_ema_of_the_student_after_every_step(dino_run):
    workdir, trainer, _ = dino_run
    before, after = state_at(trainer, workdir / "checkpoints" / "2"), state_at(trainer, workdir / "checkpoints" / "3")
    assert int(before["extra"]["step"]) == 2 and int(after["extra"]["step"]) == 3
    m = float(cosine_momentum(jax.numpy.asarray(2), STEPS, 0.9, 1.0))  # the momentum of step index 2 (the 3rd)
    jax.tree.map(lambda t0, s1, t1: np.testing.assert_allclose(t1, m * t0 + (1 - m) * s1, rtol=1e-5, atol=1e-6),
                 before["extra"]["teacher"], after["params"], after["extra"]["teacher"])
    assert not np.array_equal(before["extra"]["center"], after["extra"]["center"])  # the centre follows the batch
    assert not np.array_equal(after["params"]["dino_head"]["prototypes"],
                              after["extra"]["teacher"]["dino_head"]["prototypes"])


def test_a_dino_run_resumed_from_its_step_2_checkpoint_is_bit_identical(dino_run, tmp_path, digits_data_dir):
    full_dir, trainer, _ = dino_run
    shutil.copytree(full_dir / "checkpoints" / "2", tmp_path / "checkpoints" / "2")
    resumed = Trainer(dino_config(digits_data_dir, **{"checkpoint.every_steps": 2, "eval.evaluators": ()}),
                      str(tmp_path))
    assert resumed.start_step == 2
    resumed.train()
    full = losses(full_dir)
    assert losses(tmp_path) == {3: full[3], 4: full[4]}  # same crops, masks and data order: bit-identical losses
    jax.tree.map(np.testing.assert_array_equal, state_at(trainer, full_dir), state_at(trainer, tmp_path))


def test_vit_jax_eval_of_a_dino_run_gives_its_evaluation_and_the_frozen_feature_probes(dino_run, tmp_path):
    workdir, _, summary = dino_run
    out = tmp_path / "eval.json"
    assert cli.main(["eval", "--checkpoint", str(workdir), "--output", str(out), "--fewshot", "digits",
                     "--shots", "5", "--knn", "10,20", "--fewshot-max-train-examples", "200"]) == 0
    result = json.loads(out.read_text())
    # The evaluator's fixed crops, the teacher and centre restored: the run's final loss exactly.
    assert result["eval/dino_loss"] == pytest.approx(summary["final"]["eval/dino_loss"], abs=1e-6)
    # The k-NN vote over all 200 training features and all 360 test images (training capped the test at 120).
    assert 0.1 < result["knn/digits/10nn"] <= 1 and "knn/digits/20nn" in result and "fewshot/digits/5shot" in result
