"""The segmentation model (dense ViT + pixel head), its loss, its exact mIoU, its FLOPs and fine-tuning surgery."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.checkpoints.surgery import adapt_params
from vit_jax.eval.segmentation import evaluate_segmentation, make_segmentation_eval_step, metrics_from_confusion
from vit_jax.models.build import build_model
from vit_jax.models.config import ModelConfigError, vit_config
from vit_jax.models.flops import segmentation_flops, vit_flops
from vit_jax.models.segmentation import SegmentationViT, confusion_matrix, pixel_cross_entropy
from vit_jax.models.vit import FunctionalViT

K = 5


def tiny(**kw):
    base = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=4, image_size=16, posemb="learn", dense=True)
    return vit_config(None, **{**base, **kw})


def seg_model(cfg=None) -> FunctionalViT:
    return FunctionalViT(cfg or tiny(), functools.partial(SegmentationViT, num_classes=K))


def test_logits_per_pixel_and_zero_initialised_head():
    model = seg_model()
    params = model.init(jax.random.key(0))
    images = jax.random.uniform(jax.random.key(1), (2, 16, 16, 3), minval=-1, maxval=1)
    logits, out = model.apply(params, images)
    assert logits.shape == (2, 16, 16, K) and logits.dtype == jnp.float32
    assert out["tokens"].shape == (2, 4, 4, 32)
    labels = jnp.zeros((2, 16, 16), jnp.int32)
    np.testing.assert_allclose(pixel_cross_entropy(logits, labels), np.log(K), rtol=1e-5)  # zero head: uniform (a float32 mean over 512 pixels)
    assert set(params["head"]) == {"norm", "classifier"}
    assert params["head"]["classifier"]["kernel"].shape == (32, 16 * K)


def test_pixel_head_maps_each_token_to_its_own_patch():
    model = seg_model()
    params = model.init(jax.random.key(0))
    params["head"]["classifier"]["kernel"] = jax.random.normal(jax.random.key(2), (32, 16 * K))
    images = jax.random.uniform(jax.random.key(1), (1, 16, 16, 3))
    logits, out = model.apply(params, images)
    mixed = model.bind(params).head(out["dense"])
    np.testing.assert_allclose(logits, mixed)
    # Patch (1, 2) of the grid (rows 4..7, columns 8..11) comes from token (1, 2) alone.
    bound = model.bind(params).head
    one = bound.classifier(bound.norm(out["dense"][0, 1, 2])).reshape(4, 4, K)
    np.testing.assert_allclose(logits[0, 4:8, 8:12], one, rtol=1e-5, atol=1e-6)


def test_loss_and_confusion_ignore_out_of_range_labels_and_padding():
    logits = jnp.zeros((2, 2, 2, 3)).at[..., 1].set(5.0)  # predicts class 1 everywhere
    labels = jnp.array([[[1, 0], [255, 2]], [[1, 1], [1, 1]]])
    weights = jnp.array([1.0, 0.0])  # the second example is padding
    confusion = np.asarray(confusion_matrix(logits, labels, weights))
    np.testing.assert_array_equal(confusion, [[0, 1, 0], [0, 1, 0], [0, 1, 0]])
    logp = jax.nn.log_softmax(jnp.array([0.0, 5.0, 0.0]))
    np.testing.assert_allclose(pixel_cross_entropy(logits, labels, weights), -(logp[1] + logp[0] + logp[2]) / 3,
                               rtol=1e-6)


def test_miou_of_a_known_confusion():
    # Rows: true class, columns: predicted. Class 2 is predicted (5 pixels) but never labelled: IoU 0. Class 3 occurs
    # nowhere: no IoU, left out of the mean.
    confusion = np.array([[50, 10, 0, 0], [5, 30, 5, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    m = metrics_from_confusion(confusion)
    iou0, iou1 = 50 / (50 + 5 + 10), 30 / (30 + 10 + 10)
    assert m["miou"] == pytest.approx((iou0 + iou1 + 0.0) / 3)
    assert m["pixel_acc"] == pytest.approx(80 / 100)
    assert m["iou"][2] == 0.0 and np.isnan(m["iou"][3])


def test_miou_is_exact_over_the_split_not_a_mean_of_batches():
    model = seg_model()
    params = model.init(jax.random.key(0))
    params["head"]["classifier"]["kernel"] = jax.random.normal(jax.random.key(2), (32, 16 * K))
    step = jax.jit(make_segmentation_eval_step(model))
    images = jax.random.uniform(jax.random.key(3), (6, 16, 16, 3), minval=-1, maxval=1)
    labels = jax.random.randint(jax.random.key(4), (6, 16, 16), 0, K)
    whole = {"image": images, "segmentation": labels, "_mask": jnp.ones((6,))}
    batches = [{k: v[i:i + 4] for k, v in whole.items()} for i in (0, 4)]
    batches[1] = {k: jnp.concatenate([v, v[:2]]) for k, v in batches[1].items()}  # padded to 4 rows ...
    batches[1]["_mask"] = jnp.array([1.0, 1.0, 0.0, 0.0])  # ... and masked
    split = evaluate_segmentation(step, params, batches)
    one = evaluate_segmentation(step, params, [whole])
    assert split["count"] == 6 and split["miou"] == pytest.approx(one["miou"], abs=1e-12)
    assert split["loss"] == pytest.approx(one["loss"], rel=1e-5)
    logits, _ = model.apply(params, images)
    assert split["pixel_acc"] == pytest.approx(float(jnp.mean(jnp.argmax(logits, -1) == labels)))


def test_flops_include_the_head():
    cfg = tiny()
    flops = segmentation_flops(cfg, K)
    assert flops.forward - vit_flops(cfg).forward == pytest.approx(2.0 * 32 * 16 * 16 * K)
    assert flops.breakdown["pixel_head"] == pytest.approx(2.0 * 32 * 16 * 16 * K)


def test_the_model_refuses_a_classifier_config():
    with pytest.raises(ModelConfigError, match="dense=True"):
        seg_model(vit_config(None, width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=4, image_size=16,
                             num_classes=0))


def test_fine_tuning_from_a_classifier_loads_the_encoder_and_adds_the_head():
    src_cfg = vit_config(None, width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=4, image_size=8,
                         posemb="learn", pool="token", num_classes=10)
    src = build_model(src_cfg).init(jax.random.key(5))
    cfg = tiny()  # 16x16 images: the position embedding is resized (class-token row dropped)
    model = seg_model(cfg)
    params, notes = adapt_params(jax.device_get(src), src_cfg, jax.device_get(model.init(jax.random.key(6))), cfg)
    jax.tree.map(np.testing.assert_array_equal, params["encoder"]["blocks"], src["encoder"]["blocks"])
    np.testing.assert_array_equal(params["embedding"]["kernel"], src["embedding"]["kernel"])
    assert params["pos_embedding"].shape == (1, 16, 32)
    assert not np.any(params["head"]["classifier"]["kernel"])  # fresh (zero) pixel head
    text = "\n".join(notes)
    assert "dropped cls" in text and "dropped encoder/norm/scale" in text and "resized pos_embedding" in text
    assert "new head/classifier/kernel" in text and "dropped head/kernel" in text
    logits, _ = model.apply(params, jnp.zeros((1, 16, 16, 3)))
    assert logits.shape == (1, 16, 16, K)
