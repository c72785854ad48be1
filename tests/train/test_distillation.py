"""The `distillation` objective: its losses on hand-computed cases, and a run on the data x fsdp mesh whose teacher
(a timm .safetensors, wider and deeper than the student) is sharded, counted in the FLOPs, never trained, and saved
and restored so that a resumed run repeats the uninterrupted one bit for bit."""

import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.launch.helpers import losses
from tests.train.helpers import demo_config
from vit_jax.checkpoints.timm import save_timm
from vit_jax.checkpoints.training import load_state_from_run
from vit_jax.errors import ConfigError
from vit_jax.models.build import build_model, model_flops
from vit_jax.models.config import vit_config
from vit_jax.train.config import validate
from vit_jax.train.objectives.distillation import hard_distillation, soft_distillation
from vit_jax.train.trainer import Trainer

STUDENT = {"model.width": 32, "model.depth": 1, "model.mlp_dim": 64, "model.num_heads": 2, "model.pool": "token"}
TEACHER = vit_config(None, num_classes=10, image_size=16, patch_size=4, width=64, depth=2, mlp_dim=128,
                     num_heads=4)


def test_soft_distillation_is_tau_squared_kl_of_a_known_case():
    # teacher probabilities (1/4, 3/4), student (1/2, 1/2): KL = 1/4 ln(1/2) + 3/4 ln(3/2)
    teacher = jnp.array([[0.0, math.log(3.0)]])
    student = jnp.zeros((1, 2))
    np.testing.assert_allclose(soft_distillation(student, teacher, 1.0), [0.25 * math.log(0.5) + 0.75 * math.log(1.5)],
                               rtol=1e-6)
    # at tau = 2 the teacher's probabilities are softmax(0, ln(3)/2) = (1, sqrt 3) / (1 + sqrt 3), times tau^2
    p = np.array([1.0, math.sqrt(3.0)]) / (1.0 + math.sqrt(3.0))
    np.testing.assert_allclose(soft_distillation(student, teacher, 2.0), [4.0 * np.sum(p * np.log(p / 0.5))],
                               rtol=1e-6)
    np.testing.assert_allclose(soft_distillation(teacher, teacher, 3.0), [0.0], atol=1e-7)
    # hard: cross-entropy against the teacher's top class (class 1): -log softmax(student)[1] = ln 2
    np.testing.assert_allclose(hard_distillation(student, teacher), [math.log(2.0)], rtol=1e-6)


def distill_config(data_dir, teacher, **overrides):
    return demo_config(data_dir, **{
        **STUDENT, "objective": "distillation", "distill.teacher": str(teacher), "distill.mode": "soft",
        "distill.temperature": 2.0, "distill.alpha": 0.5, "loss.mixup_alpha": 0.2,
        "total_steps": 4, "checkpoint.every_steps": 2, "eval.every_steps": 4,
        "eval.evaluators": ("distillation",), "mesh.data": 2, "mesh.fsdp": 4, **overrides})


def test_config_errors_are_one_line(digits_data_dir):
    with pytest.raises(ConfigError, match="needs distill.teacher"):
        validate(distill_config(digits_data_dir, ""))
    with pytest.raises(ConfigError, match="is the KL at temperature 1"):
        validate(distill_config(digits_data_dir, "t.safetensors", **{"distill.mode": "function_matching"}))
    with pytest.raises(ConfigError, match="distill.mode='dark' is not one of"):
        validate(distill_config(digits_data_dir, "t.safetensors", **{"distill.mode": "dark"}))


@pytest.fixture(scope="module")
def teacher_file(tmp_path_factory):
    """A random teacher with a non-zero head (so that its predictions are not uniform), as a timm state dict."""
    model = build_model(TEACHER)
    params = jax.tree.map(np.asarray, model.init(jax.random.key(7)))
    params["head"]["kernel"] = np.random.default_rng(0).normal(size=params["head"]["kernel"].shape).astype(np.float32)
    path = tmp_path_factory.mktemp("teacher") / "teacher.safetensors"
    save_timm(str(path), params, TEACHER)
    return path, params


@pytest.fixture(scope="module")
def run(tmp_path_factory, digits_data_dir, teacher_file):
    workdir = tmp_path_factory.mktemp("distill") / "run"
    c = distill_config(digits_data_dir, teacher_file[0])
    validate(c)
    summary = Trainer(c, str(workdir)).train()
    return workdir, summary, c


def test_a_run_counts_the_teacher_and_evaluates_against_it(run):
    workdir, summary, c = run
    assert summary["steps"] == 4 and summary["skipped_steps"] == 0
    student = build_model(vit_config(None, num_classes=10, image_size=16, patch_size=4, width=32, depth=1,
                                     mlp_dim=64, num_heads=2))
    assert student.num_params() < build_model(TEACHER).num_params() / 4  # the teacher is the bigger model
    # training FLOPs per image: the student's forward and backward, the teacher's forward once
    expected = 3 * model_flops(student.cfg).forward + model_flops(TEACHER).forward
    assert summary["compute"]["train_flops_per_image"] == pytest.approx(expected)
    final = summary["final"]
    assert final["eval/count"] == 360 and 0 <= final["eval/agreement"] <= 1 and 0 <= final["eval/teacher_top1"] <= 1


def test_the_teacher_is_sharded_frozen_and_resumes_exactly(run, tmp_path, digits_data_dir, teacher_file):
    full, _, c = run
    shutil.copytree(full / "checkpoints" / "2", tmp_path / "checkpoints" / "2")
    trainer = Trainer(c, str(tmp_path))
    assert trainer.start_step == 2
    specs = [tuple(x.sharding.spec) for x in jax.tree.leaves(trainer.state["extra"]["teacher"])]
    assert any("fsdp" in s for s in specs)  # sharded over the fsdp axis by the parameters' rules, not replicated
    trainer.train()
    assert sorted(losses(full)) == [1, 2, 3, 4] and sorted(losses(tmp_path)) == [3, 4]
    assert losses(tmp_path) == {k: v for k, v in losses(full).items() if k > 2}  # bit-identical steps 3-4
    shapes = {"params": trainer.program.model.shapes, "extra": jax.eval_shape(lambda: trainer.state["extra"])}
    _, first = load_state_from_run(str(full / "checkpoints" / "2"), shapes)
    _, last = load_state_from_run(str(full), shapes)
    written = teacher_file[1]
    for saved in (first, last):  # the teacher as written, bit for bit, after training
        jax.tree.map(np.testing.assert_array_equal, saved["extra"]["teacher"], written)
    assert not np.array_equal(first["params"]["head"]["kernel"], last["params"]["head"]["kernel"])


def test_deits_distillation_token_learns_the_teacher_and_its_class_token_the_labels():
    """With a distilled student, the label loss reaches only the class head and the distillation loss only the
    distillation head (DeiT's split), and the eval step predicts with their average."""
    from vit_jax.train.objectives.distillation import DistillConfig, Distillation

    student_cfg = vit_config(None, num_classes=10, image_size=16, patch_size=4, width=32, depth=1, mlp_dim=64,
                             num_heads=2, distilled=True)
    teacher_params = build_model(TEACHER).init(jax.random.key(1))
    teacher_params["head"]["kernel"] = jax.random.normal(jax.random.key(2), teacher_params["head"]["kernel"].shape)
    images = jax.random.uniform(jax.random.key(3), (4, 16, 16, 3), minval=-1, maxval=1)
    inputs = {"image": images, "labels": jax.nn.one_hot(jnp.arange(4), 10)}
    params = build_model(student_cfg).init(jax.random.key(4))
    for alpha, trained, untouched in ((1.0, "head_dist", "head"), (0.0, "head", "head_dist")):
        objective = Distillation(student_cfg, DistillConfig(teacher="t", mode="hard", alpha=alpha), TEACHER,
                                 teacher_params)
        extra = objective.init_extra(None)
        grads = jax.jit(jax.grad(objective.loss))(params, inputs, jax.random.key(5), extra)
        assert np.abs(grads[trained]["kernel"]).max() > 0
        assert np.abs(grads[untouched]["kernel"]).max() == 0
    assert objective.flops.train == 3 * model_flops(student_cfg).forward + model_flops(TEACHER).forward
