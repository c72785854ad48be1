"""loss.bce_target_threshold: sigmoid cross-entropy on binarised (smoothed, mixed) targets, as timm's
BinaryCrossEntropy(target_threshold) trains DeiT III and "ResNet strikes back"."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.data.mixup import mixup
from vit_jax.models.build import build_model
from vit_jax.models.config import vit_config
from vit_jax.models.losses import smooth_labels, threshold_targets
from vit_jax.train.config import ConfigError, default_config, validate
from vit_jax.train.objectives.classification import Classification


def test_mixed_targets_binarised_at_the_threshold():
    labels = smooth_labels(jax.nn.one_hot(jnp.array([0, 1]), 10), 0.1)  # 0.91 / 0.01
    mixed = mixup({"image": jnp.zeros((2, 1)), "labels": labels}, jax.random.key(0), 0.0)["labels"]
    np.testing.assert_array_equal(threshold_targets(mixed, 0.2), jax.nn.one_hot(jnp.array([0, 1]), 10))
    lam = 0.7  # example 0 mixed with example 1: 0.7 * 0.91 + 0.3 * 0.01 = 0.64 and 0.28 for classes 0 and 1
    both = lam * labels[0] + (1 - lam) * labels[1]
    np.testing.assert_allclose(both[:2], [0.64, 0.28], atol=1e-6)
    np.testing.assert_array_equal(threshold_targets(both, 0.2), [1, 1] + [0] * 8)
    np.testing.assert_array_equal(threshold_targets(both, 0.3), [1] + [0] * 9)
    assert threshold_targets(both, 0.0) is both


def test_the_objective_trains_on_the_binary_targets():
    model = build_model(vit_config(None, num_classes=10, image_size=8, patch_size=4, width=16, depth=1, mlp_dim=32,
                                   num_heads=2))
    params = model.init(jax.random.key(0))
    head = params["head"]["kernel"]  # zero-initialised: every logit 0 would make the sigmoid loss ln 2 for any target
    params["head"]["kernel"] = jax.random.normal(jax.random.key(3), head.shape)
    batch = {"image": jax.random.normal(jax.random.key(1), (4, 8, 8, 3)),
             "labels": jax.nn.one_hot(jnp.arange(4), 10)}

    def loss(**kw):
        obj = Classification(model, "sigmoid_xent", **kw)
        return float(jax.jit(obj.loss)(params, obj.inputs(batch, None), jax.random.key(2)))

    # smoothing 0.1 then threshold 0.2: the one-hot targets again, so the loss without smoothing
    assert loss(label_smoothing=0.1, bce_target_threshold=0.2) == pytest.approx(loss(), rel=1e-6)
    assert loss(label_smoothing=0.1) != pytest.approx(loss(), rel=1e-3)


def test_config_errors():
    c = default_config()
    c.total_steps, c.loss.bce_target_threshold = 1, 0.2
    with pytest.raises(ConfigError, match="binary targets are for loss.kind='sigmoid_xent'"):
        validate(c)
    c.loss.kind = "sigmoid_xent"
    validate(c)
    c.loss.bce_target_threshold = 1.5
    with pytest.raises(ConfigError, match=r"threshold in \(0, 1\)"):
        validate(c)


def test_distillations_label_term_too_and_other_objectives_refuse():
    from vit_jax.train.objectives.distillation import DistillConfig, Distillation

    student = vit_config(None, num_classes=10, image_size=8, patch_size=4, width=16, depth=1, mlp_dim=32, num_heads=2)
    teacher = build_model(student).init(jax.random.key(5))
    params = build_model(student).init(jax.random.key(0))
    params["head"]["kernel"] = jax.random.normal(jax.random.key(3), params["head"]["kernel"].shape)
    batch = {"image": jax.random.normal(jax.random.key(1), (4, 8, 8, 3)), "labels": jax.nn.one_hot(jnp.arange(4), 10),
             "label": jnp.arange(4)}

    def loss(**kw):
        obj = Distillation(student, DistillConfig(teacher="t", alpha=0.5), student, teacher, "sigmoid_xent", **kw)
        extra = obj.init_extra(None)
        return float(jax.jit(obj.loss)(params, obj.inputs(batch, None), jax.random.key(2), extra))

    assert loss(label_smoothing=0.1, bce_target_threshold=0.2) == pytest.approx(loss(), rel=1e-6)
    assert loss(label_smoothing=0.1) != pytest.approx(loss(), rel=1e-4)
    c = default_config()
    c.total_steps, c.objective, c.loss.kind, c.loss.bce_target_threshold = 1, "mae", "sigmoid_xent", 0.2
    c.eval.evaluators = ("reconstruction",)
    with pytest.raises(ConfigError, match="has no label loss it binarises"):
        validate(c)
