"""MAE through the real trainer (8 simulated devices): a run on a data x fsdp x tensor mesh with its reconstruction
evaluation and few-shot probe, exact resume from a mid-run checkpoint, and fine-tuning a classifier from it.

One MAE run serves all (compiling the step is most of the time): its step-2 checkpoint, resumed in a fresh workdir,
must reproduce its steps 3-4 bit for bit.
"""

import json
import shutil

import jax
import numpy as np
import pytest

from tests.launch.helpers import losses
from tests.train.helpers import demo_config
from vit_jax import cli
from vit_jax.checkpoints.training import load_params_from_run
from vit_jax.train.config import ConfigError
from vit_jax.train.trainer import Trainer

pytestmark = pytest.mark.slow

STEPS = 4


def mae_config(data_dir, **overrides):
    """A tiny MAE run: 32 px digits in 8 px patches (16 patches, 4 visible), width 32, encoder and decoder depth 1."""
    return demo_config(data_dir, **{
        "objective": "mae", "total_steps": STEPS, "batch_size": 16,
        "model.width": 32, "model.depth": 1, "model.mlp_dim": 64, "model.num_heads": 2, "model.patch_size": 8,
        "model.image_size": 32, "model.pool": "token",
        "data.pp_train": "decode|resize(32)|value_range(-1,1)", "data.pp_eval": "decode|resize(32)|value_range(-1,1)",
        "loss.label_smoothing": 0.0,
        "mae.decoder_width": 32, "mae.decoder_depth": 1, "mae.decoder_heads": 2, "mae.decoder_mlp_dim": 64,
        "eval.evaluators": ("reconstruction", "fewshot"), "eval.batch_size": 120,
        "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, **overrides})


@pytest.fixture(scope="module")
def mae_run(tmp_path_factory, digits_data_dir):
    workdir = tmp_path_factory.mktemp("mae") / "run"
    c = mae_config(digits_data_dir, **{"checkpoint.every_steps": 2, "eval.fewshot.datasets": ("digits",),
                                       "eval.fewshot.shots": (5,), "eval.fewshot.seeds": 1,
                                       "eval.fewshot.max_train_examples": 200, "eval.fewshot.max_test_examples": 120})
    summary = Trainer(c, str(workdir)).train()
    return workdir, c, summary


def test_mae_trains_on_a_data_fsdp_tensor_mesh_and_evaluates(mae_run):
    workdir, _, summary = mae_run
    assert summary["status"] == "finished" and summary["steps"] == STEPS and summary["skipped_steps"] == 0
    logged = losses(workdir)
    assert sorted(logged) == list(range(1, STEPS + 1)) and all(np.isfinite(list(logged.values())))
    final = summary["final"]
    assert final["eval/count"] == 360  # the whole digits test split, padded batches masked
    assert 0 < final["eval/reconstruction_loss"] < 2  # per-patch normalised targets: ~1 for an untrained decoder
    assert "fewshot/digits/5shot" in final
    assert summary["best"]["eval/reconstruction_loss"] == final["eval/reconstruction_loss"]
    # FLOPs: the encoder on 4 + 1 of 17 tokens, the decoder on all (models/flops.py mae_flops, tested against XLA).
    # By hand: patch embedding 196608 + encoder 85120 + decoder embedding 10240 + decoder 315520 + prediction 196608.
    assert summary["compute"]["train_flops_per_image"] == 3 * 804_096


def test_an_mae_run_resumed_from_its_step_2_checkpoint_is_bit_identical(mae_run, tmp_path, digits_data_dir):
    full_dir, c, _ = mae_run
    shutil.copytree(full_dir / "checkpoints" / "2", tmp_path / "checkpoints" / "2")
    c = mae_config(digits_data_dir, **{"checkpoint.every_steps": 2, "eval.evaluators": ()})
    trainer = Trainer(c, str(tmp_path))
    assert trainer.start_step == 2
    trainer.train()
    full = losses(full_dir)
    assert losses(tmp_path) == {3: full[3], 4: full[4]}  # same masks, same data order: bit-identical losses
    jax.tree.map(np.testing.assert_array_equal, load_params_from_run(str(full_dir))[1],
                 load_params_from_run(str(tmp_path))[1])


def test_vit_jax_eval_of_an_mae_run_is_its_reconstruction_evaluation(mae_run, tmp_path):
    workdir, _, summary = mae_run
    out = tmp_path / "eval.json"
    assert cli.main(["eval", "--checkpoint", str(workdir), "--output", str(out)]) == 0
    result = json.load(open(out))
    assert "eval/top1" not in result and result["eval/count"] == 360
    # The evaluator's masks (at the recorded eval batch size), the decoder restored: the run's final loss exactly.
    assert result["eval/reconstruction_loss"] == pytest.approx(summary["final"]["eval/reconstruction_loss"], abs=1e-6)


def test_finetuning_from_an_mae_run_loads_the_encoder_and_adds_a_zero_head(mae_run, tmp_path, digits_data_dir,
                                                                          capsys):
    workdir, _, _ = mae_run
    c = demo_config(digits_data_dir, **{
        "model.variant": "", "model.width": 0, "model.depth": 0, "model.mlp_dim": 0, "model.num_heads": 0,
        "model.patch_size": 0, "model.image_size": 32, "model.pool": "token", "init.checkpoint": str(workdir),
        "data.pp_train": "decode|resize(32)|value_range(-1,1)", "data.pp_eval": "decode|resize(32)|value_range(-1,1)",
        "total_steps": 1, "batch_size": 16})
    trainer = Trainer(c, str(tmp_path))
    assert "new head/kernel (32, 10) (fresh init)" in capsys.readouterr().out
    params = jax.device_get(trainer.state["params"])
    _, pretrained = load_params_from_run(str(workdir))
    assert "decoder" not in params and "decoder" not in pretrained
    jax.tree.map(np.testing.assert_array_equal, {k: v for k, v in params.items() if k != "head"}, pretrained)
    assert not np.any(params["head"]["kernel"]) and not np.any(params["head"]["bias"])
    assert params["head"]["kernel"].shape == (32, 10)


def test_mae_config_mistakes_are_one_line_errors(mae_run, tmp_path, digits_data_dir):
    workdir, _, _ = mae_run
    with pytest.raises(ConfigError, match="holds a run of objective 'mae'"):  # resuming it as another objective
        Trainer(mae_config(digits_data_dir, objective="classification", **{"eval.evaluators": ()}), str(workdir))
    with pytest.raises(ConfigError, match="holds a run of objective 'mae' with other settings"):
        Trainer(mae_config(digits_data_dir, **{"mae.decoder_width": 64}), str(workdir))
    with pytest.raises(ConfigError, match=r"eval.evaluators=\(\"reconstruction\", \"fewshot\"\)"):
        Trainer(mae_config(digits_data_dir, **{"eval.evaluators": ("classification",)}), str(tmp_path / "a"))
    with pytest.raises(ConfigError, match="objective 'mae' does not use"):
        Trainer(mae_config(digits_data_dir, **{"loss.mixup_alpha": 0.2}), str(tmp_path / "b"))
    with pytest.raises(ConfigError, match=r"'mpp'.*choose one of classification, .*\bmae\b"):
        Trainer(mae_config(digits_data_dir, objective="mpp"), str(tmp_path / "c"))
