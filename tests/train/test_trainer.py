"""End-to-end trainer runs in-process (8 simulated devices): outputs, evaluation counts, restore onto other device
counts, the NaN guard, and fine-tuning from an official checkpoint at a higher resolution."""

import importlib.util
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import GOLDEN
from tests.train.helpers import ROOT, demo_config
from vit_jax.checkpoints.loading import load_any
from vit_jax.checkpoints.npz import load_npz_params
from vit_jax.checkpoints.training import RunCheckpointer
from vit_jax.models.config import vit_config
from vit_jax.models.vit import FunctionalViT
from vit_jax.train.objectives import Classification
from vit_jax.train.optimizer import make_optimizer, make_schedule
from vit_jax.train.program import build_program
from vit_jax.train.step import init_state, make_train_step
from vit_jax.train.trainer import NonFiniteError, Trainer


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, digits_data_dir):
    workdir = str(tmp_path_factory.mktemp("run"))
    c = demo_config(digits_data_dir, **{"mesh.data": 2, "mesh.fsdp": 4, "checkpoint.every_steps": 4,
                                         "eval.every_steps": 6, "eval.batch_size": 64,
                                         "eval.fewshot.datasets": ("digits",), "eval.fewshot.shots": (1, 5)})
    summary = Trainer(c, workdir).train()
    return workdir, c, summary


def test_a_run_writes_checkpoints_metrics_summary_and_plot(finished_run):
    workdir, c, summary = finished_run
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints")))[-3:] == ["12", "4", "8"]
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(workdir, "tb")))
    assert os.path.getsize(os.path.join(workdir, "curves.png")) > 10_000
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    train_steps = [r["step"] for r in rows if "train/loss" in r]
    assert train_steps == list(range(1, 13))
    timed = [r for r in rows if "perf/mfu" in r]
    assert timed and all(r["perf/img_per_sec"] > 0 and 0 < r["perf/mfu"] for r in timed)
    last_train = [r for r in rows if "train/loss" in r][-1]
    assert last_train["progress/examples_seen"] == 12 * 32 and last_train["progress/epoch"] == pytest.approx(384 / 1437)
    evals = [r for r in rows if "eval/top1" in r]
    assert [r["step"] for r in evals] == [6, 12]
    # Padded + masked evaluation: 360 test images with batches of 64 -> exactly 360 counted.
    assert all(r["eval/count"] == 360 for r in evals)
    on_disk = json.load(open(os.path.join(workdir, "summary.json")))
    assert on_disk["status"] == "finished" and on_disk["steps"] == 12
    assert on_disk["final"]["eval/top1"] == evals[-1]["eval/top1"]
    assert set(on_disk["final"]) >= {"fewshot/digits/1shot", "fewshot/digits/5shot"}
    assert on_disk["compute"]["exaflops"] == pytest.approx(12 * 32 * on_disk["compute"]["train_flops_per_image"] / 1e18)
    assert on_disk["model"]["params"] > 0 and on_disk["dataset"]["train_examples"] == 1437
    assert on_disk["compute"]["num_devices"] == 8
    assert on_disk["model"]["attention"] == {"requested": "auto", "used": "cpu", "why": "auto: float32 on CPU"}


def test_checkpoint_is_self_describing_and_loads_anywhere(finished_run):
    workdir, c, _ = finished_run
    cfg, params = load_any(workdir)  # what `vit-jax predict/convert/eval` use
    assert cfg.width == c.model.width and cfg.num_classes == 10
    from vit_jax.checkpoints.training import load_run_metadata

    meta = load_run_metadata(workdir)
    assert meta["pp_eval"] == c.data.pp_eval and meta["dataset"]["name"] == "digits"
    assert meta["config"]["batch_size"] == 32 and meta["version"]


def test_restore_onto_an_fsdp_and_tensor_mesh_then_continue_training(finished_run, tmp_path):
    # The 12-step run (data 2 x fsdp 4) restored at step 8 and continued to its end on its own mesh and on fsdp 2 x
    # tensor 4: the parameters land on the new shardings and training goes on to the same losses. (From step 8 of
    # the same 12 steps rather than on to a 16th: the length is compiled into the train step, so the run on its own
    # mesh loads the fixture's program from the compilation cache instead of compiling another.)
    workdir, c, _ = finished_run
    runs = {}
    for name, mesh in (("same", (2, 4, 1)), ("tensor", (1, 2, 4))):
        shutil.copytree(workdir, tmp_path / name)
        shutil.rmtree(tmp_path / name / "checkpoints" / "12")
        c2 = c.copy_and_resolve_references()
        c2.mesh.data, c2.mesh.fsdp, c2.mesh.tensor = mesh
        c2.eval.fewshot.datasets = ()
        t = Trainer(c2, str(tmp_path / name))
        assert t.start_step == 8
        if name == "tensor":
            spec = t.state["params"]["encoder"]["blocks"]["mlp"]["fc1"]["kernel"].sharding.spec
            assert "tensor" in str(spec) and "fsdp" in str(spec), spec
        t.train()
        rows = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
        runs[name] = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r and r["step"] > 8}
    assert sorted(runs["same"]) == [9, 10, 11, 12]
    for step, loss in runs["same"].items():
        assert runs["tensor"][step] == pytest.approx(loss, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("n_devices", [1, 4])
def test_restore_onto_a_different_number_of_devices(finished_run, n_devices):
    workdir, c, _ = finished_run
    saved = RunCheckpointer(os.path.join(workdir, "checkpoints"))
    ref = None
    for devices, mesh in ((jax.devices(), (2, 4, 1)), (jax.devices()[:n_devices], (-1, 1, 1))):
        c2 = c.copy_and_resolve_references()
        c2.mesh.data, c2.mesh.fsdp, c2.mesh.tensor = mesh
        from vit_jax.train.config import resolve_durations

        prog = build_program(c2, 10, resolve_durations(c2, 1437), devices=devices)
        state, data_state, meta = saved.restore(12, prog.abstract_state)
        assert data_state["step"] == 12 and int(state["step"]) == 12
        assert len(state["params"]["head"]["kernel"].sharding.device_set) == len(devices)
        host = jax.device_get(state)
        if ref is None:
            ref = host
        else:
            jax.tree.map(np.testing.assert_array_equal, host, ref)
    saved.close()


def test_nan_guard_stops_after_k_consecutive_bad_steps_and_saves_a_finite_state(tmp_path, digits_data_dir):
    # An absurd learning rate: every update overflows the parameters (or their norm) to inf. Such updates are
    # rejected, not only non-finite losses and gradients, so the state saved at the stop is the last good one.
    c = demo_config(digits_data_dir, **{"optimizer.lr": 1e37, "optimizer.warmup_steps": 0, "nan_guard.max_consecutive": 3,
                                        "total_steps": 20, "optimizer.grad_clip_norm": 0.0})
    with pytest.raises(NonFiniteError, match="3 consecutive steps had a non-finite loss, gradient, update or param"):
        Trainer(c, str(tmp_path)).train()
    rows = [json.loads(line) for line in open(os.path.join(str(tmp_path), "metrics.jsonl"))]
    assert rows and all(np.isfinite(r["train/param_norm"]) for r in rows if "train/param_norm" in r)
    ckpt = RunCheckpointer(os.path.join(str(tmp_path), "checkpoints"))
    latest = ckpt.latest_step()
    assert latest is not None and latest < 20
    ckpt.close()
    # The checkpoint of the last good state is labelled with the step its state and data iterator are at, so a
    # rerun (say with a lower lr) resumes consistently; its parameters are the initial ones (no update was good).
    resumed = Trainer(c, str(tmp_path))
    assert resumed.start_step == latest == int(resumed.state["step"])
    params = jax.device_get(resumed.state["params"])
    fresh = jax.device_get(resumed.program.init_state(c.seed)["params"])
    jax.tree.map(np.testing.assert_array_equal, params, fresh)
    resumed.ckpt.close()


def test_loss_spike_guard_skips_a_step_whose_loss_jumps(tmp_path, digits_data_dir):
    model = FunctionalViT(vit_config(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8, image_size=16,
                                     num_classes=4))
    opt = demo_config(digits_data_dir).optimizer
    schedule = make_schedule(opt, 10, 0)
    tx = make_optimizer(opt, schedule, model.shapes)
    step = jax.jit(make_train_step(Classification(model), tx, schedule, loss_spike_factor=2.0))
    state = init_state(model.init(jax.random.key(0)), tx, jax.random.key_data(jax.random.key(1)), True)
    rng = np.random.default_rng(0)
    batch = {"image": jnp.asarray(rng.uniform(-1, 1, (8, 16, 16, 3)), jnp.float32),
             "labels": jax.nn.one_hot(jnp.arange(8) % 4, 4)}
    for _ in range(3):
        state, metrics = step(state, batch)
        assert bool(metrics["finite"])
    before = jax.device_get(state["params"])
    spiked = {**batch, "labels": batch["labels"] * 1e4}  # a batch whose loss is ~1e4 times the average
    state, metrics = step(state, spiked)
    assert not bool(metrics["finite"]) and int(state["skipped"]) == 1
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state["params"]), before)
    state, metrics = step(state, batch)  # an ordinary batch is accepted again
    assert bool(metrics["finite"]) and int(state["consecutive_skips"]) == 0


# demo_config's 12 steps, not fewer: the length is compiled into the train step (its learning-rate schedule), so the
# tests whose point is not the length share one program (this file's and test_checkpoint_failures.py's 12-step runs
# on the default mesh), compiled once per run instead of once per length.
def test_a_failing_final_evaluation_still_saves_the_final_checkpoint(tmp_path, digits_data_dir):
    c = demo_config(digits_data_dir, **{"eval.fewshot.datasets": ("digits",),
                                        "eval.fewshot.test_split": "no_such_split"})
    with pytest.raises(ValueError, match="no split 'no_such_split'"):
        Trainer(c, str(tmp_path)).train()
    ckpt = RunCheckpointer(os.path.join(str(tmp_path), "checkpoints"))
    assert ckpt.latest_step() == 12  # the rerun (with the split fixed) resumes at the end and only evaluates
    ckpt.close()
    c.eval.fewshot.test_split = ""
    summary = Trainer(c, str(tmp_path)).train()
    assert summary["steps"] == 12 and "fewshot/digits/5shot" in summary["final"]


def test_sigmoid_training_tracks_precision_at_1_as_its_best(tmp_path, digits_data_dir, capsys):
    c = demo_config(digits_data_dir, **{"total_steps": 4, "loss.kind": "sigmoid_xent", "model.head_bias_init": -10.0,
                                        "eval.every_steps": 1, "optimizer.lr": 3e-3})
    summary = Trainer(c, str(tmp_path)).train()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    history = {r["step"]: r["eval/prec1"] for r in rows if "eval/prec1" in r}
    assert sorted(history) == [1, 2, 3, 4]
    best_step = max(history, key=lambda s: (history[s], s))  # ties: the later evaluation
    assert set(summary["best"]) == {"eval/prec1", "step"}
    assert summary["best"] == {"eval/prec1": history[best_step], "step": best_step}
    assert summary["final"]["eval/prec1"] == history[4]
    assert "prec@1" in capsys.readouterr().out


def test_a_finetuning_config_without_a_checkpoint_is_an_error(tmp_path, digits_data_dir):
    from vit_jax.train.config import ConfigError

    c = demo_config(digits_data_dir, **{"init.required": True})
    with pytest.raises(ConfigError, match="fine-tunes a pretrained model but init.checkpoint is empty"):
        Trainer(c, str(tmp_path))


def test_finetune_config_takes_the_architecture_from_init_on_any_dataset(tmp_path, digits_data_dir, capsys):
    # configs/finetune.py without a variant: the model is the checkpoint's (here 64 wide, 3 blocks, patch 8), at a
    # higher resolution, on the embedded digits (any dataset the project reads).
    golden_cfg, golden = load_npz_params(str(GOLDEN / "tiny_token.npz"))
    spec = importlib.util.spec_from_file_location("finetune", ROOT / "configs" / "finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config(f"dataset=digits,init={GOLDEN / 'tiny_token.npz'},resolution=64,steps=3")
    c.data.data_dir, c.batch_size, c.model.dtype = digits_data_dir, 32, "float32"
    c.data.pp_train = "decode|resize(64)|value_range(-1,1)"
    trainer = Trainer(c, str(tmp_path))
    assert (trainer.model_cfg.width, trainer.model_cfg.depth, trainer.model_cfg.patch_size) == (64, 3, (8, 8))
    params = jax.device_get(trainer.state["params"])
    assert params["pos_embedding"].shape == (1, 1 + 8 * 8, 64)  # 4x4 grid (32 px) -> 8x8 (64 px), class row apart
    np.testing.assert_array_equal(params["pos_embedding"][0, 0], golden["pos_embedding"][0, 0])
    np.testing.assert_array_equal(params["encoder"]["blocks"]["attn"]["query"]["kernel"],
                                  golden["encoder"]["blocks"]["attn"]["query"]["kernel"])
    assert not params["head"]["kernel"].any()  # new zero-initialised head
    out = capsys.readouterr().out
    assert "architecture from" in out and out.count("head/kernel") == 1  # each change said once
    summary = trainer.train()
    assert summary["steps"] == 3 and np.isfinite(summary["final"]["eval/loss"])


def test_eval_command_reproduces_the_final_evaluation(finished_run, tmp_path):
    from vit_jax import cli

    workdir, _, summary = finished_run
    out = tmp_path / "eval.json"
    assert cli.main(["eval", "--checkpoint", workdir, "--output", str(out), "--batch-size", "64",
                     "--fewshot", "digits", "--shots", "1,5"]) == 0
    result = json.load(open(out))
    assert result["eval/count"] == 360
    assert result["eval/top1"] == pytest.approx(summary["final"]["eval/top1"], abs=1e-9)
    assert result["fewshot/digits/5shot"] == pytest.approx(summary["final"]["fewshot/digits/5shot"], abs=1e-9)


def test_a_relative_workdir_works(tmp_path, digits_data_dir, monkeypatch):
    # Orbax rejects relative checkpoint paths; `make demo` passes workdirs/demo. (12 steps: the shared program.)
    monkeypatch.chdir(tmp_path)
    summary = Trainer(demo_config(digits_data_dir), "rel/run").train()
    assert summary["workdir"] == str(tmp_path / "rel" / "run")
    assert os.listdir(tmp_path / "rel" / "run" / "checkpoints") == ["12"]
    assert (tmp_path / "rel" / "run" / "summary.json").exists()


def test_logged_averages_after_a_resume_mid_window_equal_the_uninterrupted_runs(tmp_path, digits_data_dir):
    c = demo_config(digits_data_dir, **{"log_every_steps": 5})
    Trainer(c, str(tmp_path / "full")).train()
    first = Trainer(c, str(tmp_path / "cut"))
    first.should_stop = lambda step: step == 7  # preempted at step 7: the window of steps 6..10 is half done
    assert first.train()["status"] == "preempted"
    Trainer(c, str(tmp_path / "cut")).train()

    def logged(name):
        rows = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
        return {r["step"]: (r["train/loss"], r["train/grad_norm"]) for r in rows if "train/loss" in r}

    assert logged("cut") == logged("full") and sorted(logged("full")) == [5, 10, 12]
