"""Masked patch prediction through the real trainer (8 simulated devices): a run on a data x fsdp x tensor mesh with
its masked-patch evaluation, exact resume from a mid-run checkpoint (the corruptions come from per-step keys), fine-tuning
a classifier from it, and `vit-jax eval` of the run (its own evaluation, not classification metrics on a headless
model). One run serves all: compiling the step is most of the time."""

import json
import shutil

import jax
import numpy as np
import pytest

from tests.launch.helpers import losses
from tests.train.helpers import demo_config
from vit_jax import cli
from vit_jax.checkpoints.training import load_params_from_run
from vit_jax.models.config import ModelConfigError
from vit_jax.train.config import ConfigError, validate
from vit_jax.train.trainer import Trainer

pytestmark = pytest.mark.slow

# 60 steps at a peak learning rate of 5e-3: fewer (30 at 2e-3 or 5e-3) learn only the majority colour (black), no
# better than the constant predictor; 60 reach ~49% accuracy (constant: 38%) and an eval loss of ~1.39 (constant: 1.77).
STEPS = 60
PP = "decode|resize(32)|value_range(-1,1)"
MID_RUN = STEPS - 2  # the run's checkpoint before its last (every MID_RUN steps: at 58 and 60); resumed below


def mpp_config(data_dir, **overrides):
    """A tiny MPP run: 32 px digits in 8 px patches (16 patches, 8 corrupted), width 32, depth 1."""
    return demo_config(data_dir, **{
        "objective": "masked_patch_prediction", "total_steps": STEPS, "batch_size": 16,
        "model.width": 32, "model.depth": 1, "model.mlp_dim": 64, "model.num_heads": 2, "model.patch_size": 8,
        "model.image_size": 32, "model.pool": "token", "data.pp_train": PP, "data.pp_eval": PP,
        "optimizer.lr": 5e-3, "loss.label_smoothing": 0.0, "eval.evaluators": ("masked_patch",), "eval.batch_size": 120,
        "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, **overrides})


@pytest.fixture(scope="module")
def mpp_run(tmp_path_factory, digits_data_dir):
    workdir = tmp_path_factory.mktemp("mpp") / "run"
    summary = Trainer(mpp_config(digits_data_dir, **{"checkpoint.every_steps": MID_RUN}), str(workdir)).train()
    return workdir, summary


def constant_predictor(data_dir: str) -> dict[str, float]:
    """The best predictor that ignores its input, on the digits test split's patches: always the most frequent
    3-bit mean colour (its accuracy is that colour's share) and the colours' frequencies as the predicted
    distribution (its cross-entropy is their entropy). Over all patches; the evaluation takes a random half of each
    image's patches, whose shares differ from these by sampling noise (~1%)."""
    from vit_jax.data import datasets, pp
    from vit_jax.models.mpp import color_classes

    source = datasets.open_dataset("digits", data_dir=data_dir, prepare=False).source("test")
    preprocess = pp.build(PP)
    images = np.stack([preprocess(dict(source[i]), np.random.default_rng(0))["image"] for i in range(len(source))])
    counts = np.bincount(np.asarray(color_classes(images, (8, 8), 1)).ravel())
    share = counts[counts > 0] / counts.sum()
    return {"accuracy": float(share.max()), "loss": float(-(share * np.log(share)).sum())}


def test_mpp_trains_on_a_data_fsdp_tensor_mesh_and_evaluates(mpp_run, digits_data_dir):
    workdir, summary = mpp_run
    assert summary["status"] == "finished" and summary["steps"] == STEPS and summary["skipped_steps"] == 0
    logged = list(losses(workdir).values())
    # Cross-entropy over 512 colours: log(512) = 6.24 for an untrained head, and finite throughout.
    assert len(logged) == STEPS and all(np.isfinite(logged)) and 3 < logged[0] < 9
    # It learns: the last steps' loss is well under the first steps' (~6.3 -> ~1.5).
    assert np.mean(logged[-5:]) < 0.5 * np.mean(logged[:5])
    final = summary["final"]
    assert final["eval/count"] == 360  # the whole digits test split, padded batches masked
    # It predicts from the image, not only the majority colour: better than any constant predictor, in accuracy by a
    # margin well over the sampling noise of the evaluated half of the patches, and in loss.
    constant = constant_predictor(digits_data_dir)
    assert final["eval/mpp_accuracy"] > constant["accuracy"] + 0.05
    assert final["eval/mpp_loss"] < constant["loss"]
    assert summary["best"]["eval/mpp_accuracy"] == final["eval/mpp_accuracy"]
    # FLOPs (models/flops.py mpp_flops, tested against XLA): the whole sequence, the head on the 8 corrupted patches.
    # By hand: patch embedding 196608 + encoder (one block on 17 tokens) 315520 + head 2 * 8 * 32 * 512 = 262144.
    assert summary["compute"]["train_flops_per_image"] == 3 * (196_608 + 315_520 + 262_144)


def test_an_mpp_run_resumed_from_a_mid_run_checkpoint_is_bit_identical(mpp_run, tmp_path, digits_data_dir):
    full_dir, _ = mpp_run
    shutil.copytree(full_dir / "checkpoints" / str(MID_RUN), tmp_path / "checkpoints" / str(MID_RUN))
    trainer = Trainer(mpp_config(digits_data_dir, **{"checkpoint.every_steps": MID_RUN, "eval.evaluators": ()}),
                      str(tmp_path))
    assert trainer.start_step == MID_RUN
    trainer.train()
    full = losses(full_dir)
    # Same corruptions, same data order: bit-identical.
    assert losses(tmp_path) == {s: full[s] for s in range(MID_RUN + 1, STEPS + 1)}
    jax.tree.map(np.testing.assert_array_equal, load_params_from_run(str(full_dir))[1],
                 load_params_from_run(str(tmp_path))[1])


def test_vit_jax_eval_of_an_mpp_run_is_its_masked_patch_evaluation(mpp_run, tmp_path):
    workdir, summary = mpp_run
    out = tmp_path / "eval.json"
    assert cli.main(["eval", "--checkpoint", str(workdir), "--output", str(out)]) == 0
    result = json.load(open(out))
    assert "eval/top1" not in result and result["eval/count"] == 360
    # The evaluator's corruptions at the recorded eval batch size: the run's final numbers exactly.
    assert result["eval/mpp_accuracy"] == pytest.approx(summary["final"]["eval/mpp_accuracy"], abs=1e-9)
    assert result["eval/mpp_loss"] == pytest.approx(summary["final"]["eval/mpp_loss"], abs=1e-6)


def test_vit_jax_eval_refuses_a_run_of_an_unknown_objective_in_one_line(mpp_run, tmp_path, capsys):
    workdir, _ = mpp_run
    shutil.copytree(workdir / "checkpoints", tmp_path / "checkpoints")
    for meta_file in (tmp_path / "checkpoints").glob("*/meta/metadata"):  # every step: restore may take any
        meta = json.loads(meta_file.read_text())
        meta["config"]["objective"] = "holography"  # a run of a later version's objective
        meta_file.write_text(json.dumps(meta))
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("vit-jax eval: error: ") and \
        "objective 'holography', which this version of vit_jax does not know" in line


def test_finetuning_from_an_mpp_run_loads_the_encoder_and_adds_a_zero_head(mpp_run, tmp_path, digits_data_dir,
                                                                          capsys):
    workdir, _ = mpp_run
    c = demo_config(digits_data_dir, **{
        "model.variant": "", "model.width": 0, "model.depth": 0, "model.mlp_dim": 0, "model.num_heads": 0,
        "model.patch_size": 0, "model.image_size": 32, "model.pool": "token", "init.checkpoint": str(workdir),
        "data.pp_train": PP, "data.pp_eval": PP, "total_steps": 1, "batch_size": 16})
    trainer = Trainer(c, str(tmp_path))
    assert "new head/kernel (32, 10) (fresh init)" in capsys.readouterr().out
    params = jax.device_get(trainer.state["params"])
    _, pretrained = load_params_from_run(str(workdir))
    assert "mpp" not in params and "mpp" not in pretrained  # the [mask] embedding and the MPP head are dropped
    jax.tree.map(np.testing.assert_array_equal, {k: v for k, v in params.items() if k != "head"}, pretrained)
    assert not np.any(params["head"]["kernel"]) and params["head"]["kernel"].shape == (32, 10)


def test_mpp_config_mistakes_are_one_line_errors(mpp_run, tmp_path, digits_data_dir):
    workdir, _ = mpp_run
    with pytest.raises(ConfigError, match=r"holds a run of objective 'masked_patch_prediction' with other settings "
                                          r"than this config's \(objective, mpp.\*\)"):
        Trainer(mpp_config(digits_data_dir, **{"mpp.target": "pixels_l2"}), str(workdir))
    with pytest.raises(ConfigError, match=r"eval.evaluators=\(\"masked_patch\", \"fewshot\"\)"):
        Trainer(mpp_config(digits_data_dir, **{"eval.evaluators": ("reconstruction",)}), str(tmp_path / "a"))
    with pytest.raises(ModelConfigError, match="mpp.target='mean_colour': choose one of mean_color_3bit"):
        validate(mpp_config(digits_data_dir, **{"mpp.target": "mean_colour"}))  # before any data is read
    with pytest.raises(ModelConfigError, match="mpp.mask_prob=0.9 and mpp.random_prob=0.2"):
        validate(mpp_config(digits_data_dir, **{"mpp.mask_prob": 0.9, "mpp.random_prob": 0.2}))
    with pytest.raises(ConfigError, match="objective='masked_patch_prediction' pretrains from scratch"):
        Trainer(mpp_config(digits_data_dir, **{"init.checkpoint": str(workdir)}), str(tmp_path / "c"))
