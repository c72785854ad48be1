"""Weighted k-nearest-neighbour classification on frozen features, as DINO evaluates its encoders (Caron et al. 2021,
eval_knn.py; Wu et al. 2018): features L2-normalised, cosine similarity to every training example, the k most
similar vote for their class with weight exp(similarity / T) (T = 0.07), the class with the largest vote wins.
k = 10 and 20 are the papers' settings (20 was the better on ImageNet).

It reads the same features as the few-shot probe (eval/fewshot.py extracts them once for both): `eval.fewshot.knn`
during training, `vit-jax eval --knn` afterwards.
"""

from __future__ import annotations

import numpy as np


def knn_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, *,
                 num_classes: int, ks: tuple[int, ...] = (10, 20), temperature: float = 0.07,
                 chunk: int = 1024) -> dict[int, float]:
    """{k: top-1 accuracy of the temperature-weighted k-NN vote} on the test features; `chunk` test rows at a time
    (the similarity matrix of ImageNet's 50k x 1.28M would not fit at once). k larger than the training set uses
    them all."""
    if not len(train_y) or not len(test_y):
        raise ValueError("k-NN needs labelled training and test examples")
    train = _normalise(train_x)
    test = _normalise(test_x)
    kmax = min(max(ks), len(train_y))
    correct = {k: 0 for k in ks}
    for start in range(0, len(test_y), chunk):
        sims = test[start:start + chunk] @ train.T
        top = np.argpartition(-sims, kmax - 1, axis=1)[:, :kmax]
        top_sims = np.take_along_axis(sims, top, axis=1)
        order = np.argsort(-top_sims, axis=1, kind="stable")  # most similar first, so any k <= kmax is a prefix
        top, top_sims = np.take_along_axis(top, order, axis=1), np.take_along_axis(top_sims, order, axis=1)
        weights = np.exp(top_sims / temperature)
        onehot = np.eye(num_classes)[train_y[top]]  # (rows, kmax, classes)
        for k in ks:
            kk = min(k, kmax)
            votes = np.einsum("rk,rkc->rc", weights[:, :kk], onehot[:, :kk])
            correct[k] += int(np.sum(np.argmax(votes, axis=1) == test_y[start:start + chunk]))
    return {k: correct[k] / len(test_y) for k in ks}


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
