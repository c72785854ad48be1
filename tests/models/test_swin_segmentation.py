"""A Swin as a dense model (models/swin_segmentation.py): its stage pyramid decoded by the FPN-style PyramidHead to
logits at the input resolution, reached through the family seam (Family.segmenter); analytic FLOPs within 2% of
XLA's count; a classification Swin's checkpoint loads as the backbone with a fresh head; families without a dense
model are refused in one line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.xla_cost import xla_flops_per_image
from vit_jax.checkpoints.surgery import adapt_params
from vit_jax.errors import ConfigError
from vit_jax.models.build import build_model
from vit_jax.models.family import family_of
from vit_jax.models.swin_config import swin_config
from vit_jax.models.vit import FunctionalViT

K = 5
# Two stages: a 16x16 grid of width 32 in shifted 4x4 windows, then 8x8 of width 64 (shifted too): 32x32 images.
CFG = swin_config("Swin-32-2-2", patch_size=2, window_size=4, image_size=32, num_classes=0)


@pytest.fixture(scope="module")
def model():
    module, flops = family_of(CFG).segmenter(CFG, K)
    return FunctionalViT(CFG, module), flops


def test_the_pyramid_head_gives_logits_at_the_input_resolution(model):
    model, _ = model
    params = model.init(jax.random.key(0))
    assert "norm" not in params  # each stage is normalised in the head instead of the classifier's final norm
    assert set(params["head"]) == {"norm0", "norm1", "lateral0", "lateral1", "pixels"}
    assert params["head"]["lateral1"]["kernel"].shape == (64, 32)  # stage 2's channels -> the decoder's
    images = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
    apply = jax.jit(model.apply)
    logits, out = apply(params, images)
    assert logits.shape == (2, 32, 32, K) and logits.dtype == jnp.float32
    assert [p.shape for p in out["pyramid"]] == [(2, 16, 16, 32), (2, 8, 8, 64)]
    assert not np.any(logits)  # the zero-initialised pixel classifier: uniform before training
    # The coarse stage reaches every pixel: with a non-zero classifier, changing only stage 2's lateral moves the
    # logits (the top-down path is wired in).
    params["head"]["pixels"]["classifier"]["kernel"] = jax.random.normal(jax.random.key(3), (32, 2 * 2 * K))
    before, _ = apply(params, images)
    params["head"]["lateral1"]["bias"] = jax.random.normal(jax.random.key(2), (32,))  # not a constant: LayerNorm
    after, _ = apply(params, images)
    assert np.all(np.abs(np.asarray(after - before)).reshape(-1, K).max(-1) > 1e-3)


def test_flops_match_xla_cost_analysis_within_2_percent():
    # One block per stage (the second unshifted) and 16x16 images: the count covers every kind of op of the dense
    # model at a fraction of the compile time; the shifted block's mask is covered by tests/models/test_swin.py.
    cfg = swin_config("Swin-32-1-1", patch_size=2, window_size=4, image_size=16, num_classes=0)
    module, flops = family_of(cfg).segmenter(cfg, K)
    assert flops.breakdown["pyramid_head"] > 0
    assert xla_flops_per_image(FunctionalViT(cfg, module), cfg.image_size) == pytest.approx(flops.forward, rel=0.02)


def test_a_classification_swin_checkpoint_loads_as_the_backbone_with_a_fresh_head(model):
    model, _ = model
    src_cfg = CFG.replace(num_classes=10)
    src = jax.device_get(build_model(src_cfg).init(jax.random.key(5)))
    params, notes = adapt_params(src, src_cfg, jax.device_get(model.init(jax.random.key(6))), CFG)
    jax.tree.map(np.testing.assert_array_equal, params["stage1"], src["stage1"])
    np.testing.assert_array_equal(params["patch_embed"]["kernel"], src["patch_embed"]["kernel"])
    assert not np.any(params["head"]["pixels"]["classifier"]["kernel"])
    text = "\n".join(notes)
    assert "dropped norm/scale" in text and "new head/lateral0/kernel" in text


def test_a_family_without_a_dense_model_is_refused_in_one_line():
    from vit_jax.models.bit_config import bit_config
    from vit_jax.train.objectives.segmentation import Segmentation

    with pytest.raises(ConfigError, match="BiT family does not have"):
        Segmentation(bit_config("BiT-R50x1", num_classes=0), K)
