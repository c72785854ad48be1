"""The classification metrics (top-1, top-5, precision@1, loss) over masked batches, against numpy on the same logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.eval.classification import evaluate
from vit_jax.models import vit_config
from vit_jax.models.vit import FunctionalViT
from vit_jax.eval.steps import make_eval_step


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("loss_kind", ["softmax_xent", "sigmoid_xent"])
def test_metrics_equal_an_independent_computation_and_skip_masked_rows(loss_kind):
    cfg = vit_config(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=8, image_size=16, num_classes=12)
    model = FunctionalViT(cfg)
    params = jax.tree.map(lambda x: x + 0.5 * jax.random.normal(jax.random.key(3), x.shape), model.init(
        jax.random.key(0)))  # a non-zero head, so the logits differ between classes
    rng = np.random.default_rng(0)
    n, pad = 20, 4  # two batches of 12: the last 4 rows are padding
    images = rng.uniform(-1, 1, (n + pad, 16, 16, 3)).astype(np.float32)
    label = rng.integers(0, 12, n + pad).astype(np.int32)
    labels = np.eye(12, dtype=np.float32)[label]
    labels[::3, (label[::3] + 1) % 12] = 1.0  # every third example is multi-label
    mask = np.r_[np.ones(n), np.zeros(pad)].astype(np.float32)
    batches = [{"image": images[i:i + 12], "label": label[i:i + 12], "labels": labels[i:i + 12],
                "_mask": mask[i:i + 12]} for i in (0, 12)]
    got = evaluate(jax.jit(make_eval_step(model, loss_kind)), params, batches)

    logits = np.asarray(model.apply(params, jnp.asarray(images[:n]))[0], np.float64)
    y, ys = label[:n], labels[:n]
    order = np.argsort(-logits, axis=-1)
    if loss_kind == "softmax_xent":
        loss = -(ys * _log_softmax(logits)).sum(-1)
    else:
        loss = (np.logaddexp(0, logits) - ys * logits).sum(-1)
    want = {"count": n, "top1": np.mean(order[:, 0] == y), "top5": np.mean([y[i] in order[i, :5] for i in range(n)]),
            "prec1": np.mean(ys[np.arange(n), order[:, 0]] > 0), "loss": loss.mean()}
    assert got["count"] == n
    for key in ("top1", "top5", "prec1", "loss"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    assert 0 < want["top5"] < 1  # the case is not degenerate
