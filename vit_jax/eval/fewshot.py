"""Few-shot linear evaluation as in the ViT paper: closed-form regularised least squares on frozen features.

For k shots, k training examples per class are drawn (fixed seeds), their pre-logits features are mapped to
{-1, 1}^C targets by ridge regression, and accuracy is measured on the test features. Results are averaged over
seeds.
"""

from __future__ import annotations

import numpy as np


def ridge_fit(x: np.ndarray, y: np.ndarray, l2_reg: float) -> np.ndarray:
    """Weights (with a bias row) minimising |[x 1] w - y|^2 + l2 * mean-diag-scaled |w|^2."""
    x1 = np.concatenate([x, np.ones((len(x), 1), x.dtype)], axis=1).astype(np.float64)
    gram = x1.T @ x1
    # Scale the regulariser by the features' own energy so one l2_reg suits any feature scale.
    reg = l2_reg * (np.trace(gram) / gram.shape[0]) * np.eye(gram.shape[0])
    reg[-1, -1] = 0.0  # never shrink the bias
    return np.linalg.solve(gram + reg, x1.T @ y.astype(np.float64))


def ridge_predict(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    x1 = np.concatenate([x, np.ones((len(x), 1), x.dtype)], axis=1).astype(np.float64)
    return np.argmax(x1 @ w, axis=1)


def sample_shots(labels: np.ndarray, shots: int, num_classes: int, seed: int) -> np.ndarray:
    """Indices of `shots` examples per class (fewer if a class has fewer), chosen by a fixed seed."""
    rng = np.random.default_rng(seed)
    chosen = []
    for c in range(num_classes):
        idx = np.flatnonzero(labels == c)
        if len(idx):
            chosen.append(rng.choice(idx, size=min(shots, len(idx)), replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)


def fewshot_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, *,
                     num_classes: int, shots: tuple[int, ...], l2_reg: float = 1e-2,
                     seeds: int = 3) -> dict[int, float]:
    """{k: mean test accuracy over seeds} for each k in `shots`."""
    results = {}
    for k in shots:
        accs = []
        for seed in range(seeds):
            idx = sample_shots(train_y, k, num_classes, seed)
            targets = 2.0 * np.eye(num_classes)[train_y[idx]] - 1.0
            w = ridge_fit(train_x[idx], targets, l2_reg)
            accs.append(float(np.mean(ridge_predict(w, test_x) == test_y)))
        results[k] = float(np.mean(accs))
    return results


# Test splits whose name misleads: TFDS's imagenet2012 has a `test` split only when the unlabelled test archive was
# provided (every label -1); its labelled held-out split is `validation`.
TEST_SPLIT = {"imagenet2012": "validation"}


def default_test_split(name: str, splits: list[str]) -> str:
    """The labelled held-out split of a dataset: a known exception, else `test`, else `validation`."""
    if name in TEST_SPLIT:
        return TEST_SPLIT[name]
    return "test" if "test" in splits or "validation" not in splits else "validation"


def extract_features(features_fn, params, ds, split: str, pp: str, batch_size: int, sharding,
                     max_examples: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Pre-logits features and labels of the split's examples in order (all, or the first `max_examples`; padding
    rows dropped), on every process."""
    from vit_jax.data import pipeline
    from vit_jax.data.pp import strip_label_ops
    from vit_jax.parallel.hostarrays import gather_to_host

    feats, labels, seen = [], [], 0
    # Few-shot needs images and integer labels only: one-hot/multi-hot ops are sized for another dataset.
    batches = pipeline.eval_iterator(ds, split=split, pp=strip_label_ops(pp), global_batch_size=batch_size,
                                     sharding=sharding)
    try:
        for batch in batches:
            f = gather_to_host(features_fn(params, batch["image"]))
            mask = gather_to_host(batch["_mask"]) > 0
            feats.append(f[mask])
            labels.append(gather_to_host(batch["label"])[mask])
            seen += int(mask.sum())
            # The mask is the gathered global one, so every process stops after the same batch.
            if max_examples and seen >= max_examples:
                break
    finally:
        batches.close()
    x, y = np.concatenate(feats), np.concatenate(labels)
    if max_examples:
        x, y = x[:max_examples], y[:max_examples]
    if len(y) and y.min() < 0:
        raise ValueError(f"few-shot: split '{split}' of {ds.name} has unlabelled examples (label {int(y.min())}); "
                         f"set eval.fewshot.test_split / train_split to a labelled split of {', '.join(ds.splits)}")
    return x, y


def fewshot_on_datasets(features_fn, params, names, *, data_dir, pp: str, batch_size: int, sharding,
                        train_split: str, test_split: str, shots, l2_reg: float, seeds: int,
                        max_test_examples: int, max_train_examples: int = 0, knn: tuple[int, ...] = (),
                        knn_temperature: float = 0.07) -> dict[str, float]:
    """{"fewshot/<dataset>/<k>shot": accuracy} for every named dataset, and with `knn` {"knn/<dataset>/<k>nn":
    accuracy} of the weighted k-NN vote over all the extracted training features (eval/knn.py). An empty
    `test_split` picks each dataset's labelled held-out split (default_test_split)."""
    from vit_jax.data import pipeline
    from vit_jax.eval.knn import knn_accuracy

    out = {}
    for name in names:
        ds = pipeline.open_dataset(name, data_dir=data_dir)
        test = test_split or default_test_split(name, ds.splits)
        train_x, train_y = extract_features(features_fn, params, ds, train_split, pp, batch_size, sharding,
                                            max_train_examples)
        test_x, test_y = extract_features(features_fn, params, ds, test, pp, batch_size, sharding,
                                          max_test_examples)
        accs = fewshot_accuracy(train_x, train_y, test_x, test_y, num_classes=ds.num_classes, shots=tuple(shots),
                                l2_reg=l2_reg, seeds=seeds)
        out.update({f"fewshot/{name}/{k}shot": v for k, v in accs.items()})
        if knn:
            nn = knn_accuracy(train_x, train_y, test_x, test_y, num_classes=ds.num_classes, ks=tuple(knn),
                              temperature=knn_temperature)
            out.update({f"knn/{name}/{k}nn": v for k, v in nn.items()})
    return out
