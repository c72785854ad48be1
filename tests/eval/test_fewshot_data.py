"""Few-shot evaluation on a real dataset split: which split is the test split, capped extraction, label checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax.data import pipeline
from vit_jax.eval import fewshot


def sharding():
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    return NamedSharding(mesh, P("data"))


def features(params, images):  # a fixed "model": per-image channel means of a 4x4 average pool
    b, h, w, c = images.shape
    return jnp.mean(images.reshape(b, 4, h // 4, 4, w // 4, c), axis=(2, 4)).reshape(b, -1) * params


def test_default_test_split_is_the_labelled_held_out_one():
    assert fewshot.default_test_split("cifar100", ["test", "train"]) == "test"
    assert fewshot.default_test_split("imagenet2012", ["test", "train", "validation"]) == "validation"
    assert fewshot.default_test_split("imagenet21k/fall11", ["train", "validation"]) == "validation"
    assert fewshot.default_test_split("oxford_flowers102", ["test", "train", "validation"]) == "test"


def test_extraction_stops_after_max_examples_and_keeps_the_order(digits_data_dir):
    ds = pipeline.open_dataset("digits", data_dir=digits_data_dir)
    kw = dict(pp="decode|value_range(-1,1)", batch_size=64, sharding=sharding())
    x_all, y_all = fewshot.extract_features(jax.jit(features), 1.0, ds, "train", **kw)
    assert len(x_all) == ds.num_examples("train")
    x, y = fewshot.extract_features(jax.jit(features), 1.0, ds, "train", max_examples=100, **kw)
    assert len(x) == 100
    np.testing.assert_array_equal(y, y_all[:100])
    np.testing.assert_allclose(x, x_all[:100])


def test_fewshot_on_datasets_uses_the_default_test_split_and_caps(digits_data_dir, monkeypatch):
    seen = []
    real = fewshot.extract_features

    def spy(fn, params, ds, split, pp, batch_size, sharding, max_examples=0):
        seen.append((split, max_examples))
        return real(fn, params, ds, split, pp, batch_size, sharding, max_examples)

    monkeypatch.setattr(fewshot, "extract_features", spy)
    out = fewshot.fewshot_on_datasets(jax.jit(features), 1.0, ["digits"], data_dir=digits_data_dir,
                                      pp="decode|value_range(-1,1)", batch_size=64, sharding=sharding(),
                                      train_split="train", test_split="", shots=(5,), l2_reg=1e-2, seeds=2,
                                      max_test_examples=200, max_train_examples=300)
    assert seen == [("train", 300), ("test", 200)]
    assert set(out) == {"fewshot/digits/5shot"} and 0.3 < out["fewshot/digits/5shot"] <= 1.0


def test_unlabelled_split_is_a_clear_error(digits_data_dir, monkeypatch):
    ds = pipeline.open_dataset("digits", data_dir=digits_data_dir)
    real_iter = pipeline.eval_iterator

    class Unlabelled:  # what TFDS's imagenet2012 `test` split looks like: every label -1
        def __init__(self, it):
            self.it = it

        def __iter__(self):
            for batch in self.it:
                yield {**batch, "label": jnp.full_like(batch["label"], -1)}

        def close(self):
            self.it.close()

    monkeypatch.setattr(pipeline, "eval_iterator", lambda *a, **k: Unlabelled(real_iter(*a, **k)))
    with pytest.raises(ValueError, match="unlabelled examples.*eval.fewshot.test_split"):
        fewshot.extract_features(jax.jit(features), 1.0, ds, "test", "decode|value_range(-1,1)", 64, sharding())
