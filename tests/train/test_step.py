"""The train step: gradient accumulation, the NaN guard, schedules, losses; and the few-shot evaluator."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.train.helpers import apply_overrides
from vit_jax.eval.fewshot import fewshot_accuracy
from vit_jax.train.config import Durations, default_config
from vit_jax.models.losses import sigmoid_xent, smooth_labels, softmax_xent
from vit_jax.train.optimizer import decay_mask, make_schedule
from vit_jax.train.program import build_program


def tiny_config(**overrides):
    c = default_config()
    c.model.variant = ""
    c.model.width, c.model.depth, c.model.mlp_dim, c.model.num_heads = 32, 2, 64, 2
    c.model.patch_size, c.model.image_size = 4, 8
    c.batch_size = 16
    c.total_steps = 10
    c.optimizer.lr = 1e-2
    return apply_overrides(c, overrides)


DUR = Durations(total_steps=10, warmup_steps=2, steps_per_epoch=5, eval_every=0, checkpoint_every=0, fewshot_every=0)


def batch(n=16, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    label = rng.integers(0, classes, n)
    return {"image": jnp.asarray(rng.uniform(-1, 1, (n, 8, 8, 3)), jnp.float32),
            "labels": jnp.asarray(np.eye(classes)[label], jnp.float32), "label": jnp.asarray(label, jnp.int32)}


def run(config, batches, devices=None):
    prog = build_program(config, 5, DUR, devices=devices or jax.devices()[:1])
    state = prog.init_state(config.seed)
    out = []
    for b in batches:
        state, m = prog.train_step(state, jax.device_put(b, prog.batch_sh))
        out.append(jax.device_get(m))
    return jax.device_get(state), out


def test_gradient_accumulation_equals_one_big_batch():
    b = [batch(seed=i) for i in range(2)]
    state1, m1 = run(tiny_config(), b)
    state4, m4 = run(tiny_config(micro_batches=4), b)
    for a, c in zip(m1, m4):
        assert a["loss"] == pytest.approx(c["loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(c["grad_norm"], rel=1e-5)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-6), state1["params"], state4["params"])


def test_nan_guard_skips_the_update_and_counts():
    good, bad = batch(seed=0), batch(seed=1)
    bad["image"] = bad["image"].at[3, 0, 0, 0].set(jnp.nan)
    state, metrics = run(tiny_config(), [good, bad, bad])
    assert [bool(m["finite"]) for m in metrics] == [True, False, False]
    assert [int(m["consecutive_skips"]) for m in metrics] == [0, 1, 2]
    assert int(state["skipped"]) == 2 and int(state["step"]) == 3
    after_good, _ = run(tiny_config(), [good])
    jax.tree.map(np.testing.assert_array_equal, state["params"], after_good["params"])  # bad steps left no trace
    jax.tree.map(np.testing.assert_array_equal, state["opt_state"], after_good["opt_state"])


def test_dropout_and_mixup_run_and_are_deterministic():
    c = tiny_config(**{"model.dropout": 0.1, "model.drop_path": 0.1, "loss.mixup_alpha": 0.2,
                       "loss.label_smoothing": 0.1})
    b = [batch(seed=i) for i in range(2)]
    s1, m1 = run(c, b)
    s2, m2 = run(c, b)
    assert [m["loss"] for m in m1] == [m["loss"] for m in m2]
    assert np.isfinite(m1[-1]["loss"])


def test_schedules():
    o = default_config().optimizer
    o.lr, o.end_lr_factor = 1.0, 0.0
    for name in ("cosine", "linear", "rsqrt", "constant"):
        o.schedule = name
        f = make_schedule(o, total_steps=100, warmup_steps=10)
        assert float(f(0)) == 0.0 and float(f(5)) == pytest.approx(0.5) and float(f(10)) == pytest.approx(1.0)
    o.schedule = "cosine"
    f = make_schedule(o, 100, 10)
    assert float(f(55)) == pytest.approx(0.5, abs=1e-6) and float(f(100)) == pytest.approx(0.0, abs=1e-6)
    o.schedule = "linear"
    assert float(make_schedule(o, 100, 10)(55)) == pytest.approx(0.5)


def test_losses_and_masks():
    logits = jnp.array([[2.0, 0.0, -1.0]])
    onehot = jnp.array([[1.0, 0.0, 0.0]])
    expected = -np.log(np.exp(2) / (np.exp(2) + 1 + np.exp(-1)))
    assert float(softmax_xent(logits, onehot)[0]) == pytest.approx(expected, rel=1e-6)
    sig = float(sigmoid_xent(logits, onehot)[0])
    assert sig == pytest.approx(np.log1p(np.exp(-2)) + np.log1p(np.exp(0)) + np.log1p(np.exp(-1)), rel=1e-6)
    np.testing.assert_allclose(smooth_labels(onehot, 0.3), [[0.8, 0.1, 0.1]], atol=1e-6)
    params = {"head": {"kernel": 1, "bias": 2}, "encoder": {"norm": {"scale": 3}}}
    assert decay_mask(params, "kernels") == {"head": {"kernel": True, "bias": False},
                                             "encoder": {"norm": {"scale": False}}}


def test_fewshot_on_a_separable_toy_problem():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 16)) * 5
    train_y = np.repeat(np.arange(4), 30)
    test_y = np.repeat(np.arange(4), 25)
    train_x = centres[train_y] + rng.normal(size=(len(train_y), 16))
    test_x = centres[test_y] + rng.normal(size=(len(test_y), 16))
    acc = fewshot_accuracy(train_x, train_y, test_x, test_y, num_classes=4, shots=(1, 5), seeds=3)
    assert acc[5] == 1.0 and acc[1] >= 0.9
    noise = fewshot_accuracy(rng.normal(size=(120, 16)), train_y, rng.normal(size=(100, 16)), test_y,
                             num_classes=4, shots=(5,), seeds=3)
    assert noise[5] < 0.5  # chance is 0.25: the evaluator is not leaking labels
