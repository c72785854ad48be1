"""The weighted k-NN evaluator (eval/knn.py) against a direct transcription of DINO's eval_knn.py vote, one test
row at a time."""

import numpy as np
import pytest

from vit_jax.eval.knn import knn_accuracy


def reference_vote(train_x, train_y, x, k, num_classes, t):
    """DINO's knn_classifier for one row: cosine similarities, the k largest, votes exp(sim / T) per class."""
    a = train_x / np.linalg.norm(train_x, axis=1, keepdims=True)
    sims = a @ (x / np.linalg.norm(x))
    top = np.argsort(-sims)[:k]
    votes = np.zeros(num_classes)
    for i in top:
        votes[train_y[i]] += np.exp(sims[i] / t)
    return int(np.argmax(votes))


def test_knn_accuracy_is_the_temperature_weighted_vote():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 8))
    train_y, test_y = rng.integers(0, 4, 60), rng.integers(0, 4, 25)
    train_x = centres[train_y] + 0.9 * rng.normal(size=(60, 8))
    test_x = centres[test_y] + 0.9 * rng.normal(size=(25, 8))
    got = knn_accuracy(train_x, train_y, test_x, test_y, num_classes=4, ks=(1, 10, 20), chunk=7)
    for k in (1, 10, 20):
        want = np.mean([reference_vote(train_x, train_y, x, k, 4, 0.07) == y for x, y in zip(test_x, test_y)])
        assert got[k] == pytest.approx(want)
    assert 0.5 < got[10] <= 1.0  # separable clusters: well above chance (0.25)
    # More neighbours than training examples: all of them vote.
    few = knn_accuracy(train_x[:5], train_y[:5], test_x, test_y, num_classes=4, ks=(20,))
    want = np.mean([reference_vote(train_x[:5], train_y[:5], x, 5, 4, 0.07) == y for x, y in zip(test_x, test_y)])
    assert few[20] == pytest.approx(want)
    with pytest.raises(ValueError, match="labelled training and test"):
        knn_accuracy(train_x[:0], train_y[:0], test_x, test_y, num_classes=4)
