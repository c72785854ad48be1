"""EMA of the weights (`ema.decay`, train/ema.py): the state's EMA is the NumPy recurrence of the applied parameters,
it resumes bit for bit, it is what the run's evaluator and `vit-jax predict` use, and a bad decay is one line."""

import shutil

import jax
import numpy as np
import pytest

from tests.launch.helpers import losses
from tests.train.helpers import demo_config
from vit_jax.checkpoints.training import EMA_PARAMS, load_state_from_run
from vit_jax.errors import ConfigError
from vit_jax.train.config import validate
from vit_jax.train.trainer import Trainer

DECAY = 0.6  # far from 1 so that three steps move the EMA well away from both the start and the parameters
TINY = {"model.width": 32, "model.depth": 1, "model.mlp_dim": 64, "model.num_heads": 2, "total_steps": 3,
        "checkpoint.every_steps": 1, "eval.every_steps": 3, "optimizer.lr": 1e-2, "ema.decay": DECAY}


def test_a_bad_decay_is_one_line_and_deit_takes_its_decay(digits_data_dir):
    for decay in (1.0, -0.1):
        with pytest.raises(ConfigError, match=r"ema.decay=.*give the EMA's decay per step in \[0, 1\)"):
            validate(demo_config(digits_data_dir, **{**TINY, "ema.decay": decay}))
    from tests.train.helpers import ROOT
    from vit_jax.train.config import config_module

    deit = config_module(ROOT / "configs" / "deit.py")
    assert deit.get_config("variant=Ti").ema.decay == 0.0  # Table 9: no EMA
    c = deit.get_config("variant=Ti,ema=0.99996")  # DeiT's main.py --model-ema
    validate(c)
    assert c.ema.decay == 0.99996


@pytest.fixture(scope="module")
def run(tmp_path_factory, digits_data_dir):
    workdir = tmp_path_factory.mktemp("ema") / "run"
    c = demo_config(digits_data_dir, **TINY)
    trainer = Trainer(c, str(workdir))
    start = jax.device_get(trainer.state["params"])  # the step-0 parameters the EMA starts from
    summary = trainer.train()
    return workdir, c, trainer, start, summary


def saved(path, shapes):
    """The raw parameters and the EMA of a checkpoint (asking for both keys gives each as saved)."""
    _, out = load_state_from_run(str(path), {"params": shapes, EMA_PARAMS: shapes})
    return out["params"], out[EMA_PARAMS]


def test_the_ema_is_the_numpy_recurrence_of_the_applied_parameters(run):
    workdir, _, trainer, start, summary = run
    assert summary["steps"] == 3 and summary["skipped_steps"] == 0
    shapes = trainer.program.model.shapes
    expected = jax.tree.map(lambda x: np.asarray(x, np.float64), start)
    for step in (1, 2, 3):
        params, ema = saved(workdir / "checkpoints" / str(step), shapes)
        expected = jax.tree.map(lambda e, p: DECAY * e + (1 - DECAY) * p, expected, params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), ema, expected)
    # the EMA is not the parameters, nor where they started
    assert not np.allclose(ema["head"]["kernel"], params["head"]["kernel"], atol=1e-4)
    assert not np.allclose(ema["head"]["kernel"], start["head"]["kernel"], atol=1e-4)


def test_the_run_is_evaluated_and_loaded_as_its_ema(run, tmp_path):
    workdir, _, trainer, _, summary = run
    params, ema = saved(workdir, trainer.program.model.shapes)
    # What loads the run (vit-jax eval/predict, init.checkpoint, distill.teacher) gets the EMA as its weights.
    _, loaded = load_state_from_run(str(workdir), {"params": None})
    jax.tree.map(np.testing.assert_array_equal, loaded["params"], ema)
    images = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    from vit_jax.commands.predict import main as predict

    assert predict(["--checkpoint", str(workdir), "--images", str(tmp_path / "images.npy"),
                    "--output", str(tmp_path / "logits.npy")]) == 0
    logits = np.load(tmp_path / "logits.npy")
    model = trainer.program.model
    np.testing.assert_allclose(logits, np.asarray(model.apply(ema, images)[0]), rtol=1e-5, atol=1e-5)
    assert not np.allclose(logits, np.asarray(model.apply(params, images)[0]), atol=1e-3)
    # The run's evaluators read the program's eval view of the state (hooks.run_eval), and it is the EMA.
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(trainer.program.eval_view(trainer.state)), ema)
    assert "eval/top1" in summary["final"]


def test_a_resumed_run_keeps_the_same_ema_bit_for_bit(run, tmp_path):
    workdir, c, trainer, _, _ = run
    shutil.copytree(workdir / "checkpoints" / "1", tmp_path / "checkpoints" / "1")
    resumed = Trainer(c, str(tmp_path))
    assert resumed.start_step == 1 and EMA_PARAMS in resumed.state
    resumed.train()
    assert losses(tmp_path) == {k: v for k, v in losses(workdir).items() if k > 1}
    shapes = trainer.program.model.shapes
    for a, b in zip(saved(workdir, shapes), saved(tmp_path, shapes)):
        jax.tree.map(np.testing.assert_array_equal, a, b)
    # Turning EMA off (or on) in a run's workdir is refused before any restore: the state would not match.
    with pytest.raises(ConfigError, match=r"ema.decay=0.6, this config has ema.decay=0.0"):
        Trainer(demo_config(c.data.data_dir, **{**TINY, "ema.decay": 0.0}), str(tmp_path))
