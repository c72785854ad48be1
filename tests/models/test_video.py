"""The video ViT family (ViViT): names and config errors, the family seam, tubelet shapes, logical axes, FLOPs
against XLA, and inflation of an image ViT (a clip of identical frames predicts as the image)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.checkpoints.surgery import adapt_params
from vit_jax.checkpoints.video_formats import InflationError, inflate_image_vit
from vit_jax.models import attention_cpu
from vit_jax.models.build import build_model, describe, model_flops
from vit_jax.models.config import ModelConfigError, vit_config
from vit_jax.models.video_config import VideoConfig, video_config
from vit_jax.train.config import ConfigError, default_config, model_config

TINY = dict(width=64, depth=2, mlp_dim=128, num_heads=2, num_frames=4, image_size=32, num_classes=10)


@pytest.fixture(scope="module")
def joint():
    cfg = video_config("ViViT-B/8x2", **TINY)
    model = build_model(cfg)
    return cfg, model, model.init(jax.random.key(0))


def xla_flops_per_clip(model, shape) -> float:
    def flops(batch):
        with attention_cpu.xla_ops():  # XLA counts nothing inside the CPU attention kernel's custom call
            compiled = jax.jit(lambda p, x: model.apply(p, x)[0]).lower(
                model.shapes, jax.ShapeDtypeStruct((batch, *shape), jnp.float32)).compile()
        cost = compiled.cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    return flops(2) - flops(1)


def test_names_sizes_and_config_errors():
    cfg = video_config("ViViT-B/16x2", num_classes=400)
    assert (cfg.width, cfg.depth, cfg.tubelet, cfg.grid, cfg.name) == (768, 12, 2, (16, 14, 14), "ViViT-B/16x2")
    fe = video_config("ViViT-FE-B/16x2")
    assert (fe.encoder, fe.num_temporal_blocks, fe.name) == ("factorised", 4, "ViViT-FE-B/16x2")
    with pytest.raises(ModelConfigError, match="unknown video model 'ViViT-B/16'"):
        video_config("ViViT-B/16")
    with pytest.raises(ModelConfigError, match="num_frames=5 is not a multiple of the tubelet's 2 frames"):
        video_config("ViViT-B/16x2", num_frames=5)
    with pytest.raises(ModelConfigError, match="only the factorised encoder has a temporal Transformer"):
        VideoConfig(temporal_depth=2)


def test_the_family_seam_builds_describes_and_checks_keys():
    c = default_config()
    c.model.variant, c.model.image_size, c.model.num_frames = "ViViT-FE-S/8x2", 32, 8
    c.model.width, c.model.num_heads = 64, 2
    cfg = model_config(c, 7)
    assert isinstance(cfg, VideoConfig) and (cfg.num_classes, cfg.width, cfg.encoder) == (7, 64, "factorised")
    assert describe(cfg).startswith("ViViT-FE-w64d12m1536h2/8x2 (width 64, depth 12, temporal depth 4")
    c.model.variant, c.model.num_frames = "B/16", 16
    with pytest.raises(ConfigError, match="B/16 is a ViT model, which has no model.num_frames"):
        model_config(c, 7)


def test_tubelet_shapes_and_logical_axes(joint):
    cfg, model, params = joint
    assert params["embedding"]["kernel"].shape == (2, 8, 8, 3, 64)  # (t, p, p, 3, D)
    assert params["pos_embedding"].shape == (1, 1 + 2 * 4 * 4, 64)  # class token + nt*gh*gw
    clips = jax.random.uniform(jax.random.key(1), (2, *cfg.input_shape), minval=-1, maxval=1)
    embedded = model.bind(params).embed(clips)
    assert embedded.shape == (2, 2, 4, 4, 64)  # (B, nt, gh, gw, D)
    # Tubelet (time step 1, row 2, column 3) reads frames 2-3, rows 16-23, columns 24-31.
    patch = clips[0, 2:4, 16:24, 24:32]
    expect = jnp.einsum("tpqc,tpqcd->d", patch, params["embedding"]["kernel"]) + params["embedding"]["bias"]
    np.testing.assert_allclose(embedded[0, 1, 2, 3], expect, atol=1e-5)
    # Every tubelet: the strided 3D convolution (ViViT's own computation; ours is a matmul, faster on XLA:CPU).
    conv = jax.lax.conv_general_dilated(clips, params["embedding"]["kernel"], (2, 8, 8), "VALID",
                                        dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
    np.testing.assert_allclose(embedded, conv + params["embedding"]["bias"], atol=1e-5)
    logits, out = model.apply(params, clips)
    assert logits.shape == (2, 10) and out["encoded"].shape == (2, 33, 64)
    axes = model.logical_axes
    assert jax.tree.structure(axes, is_leaf=lambda a: isinstance(a, tuple)) == jax.tree.structure(model.shapes)
    assert axes["embedding"]["kernel"][-1] == "embed" and axes["encoder"]["blocks"]["mlp"]["fc1"]["kernel"] == \
        ("layers", "embed", "mlp")
    with pytest.raises(ValueError, match=r"clips of shape \(8, 32, 32, 3\) given to a video model built for"):
        model.apply(params, jnp.zeros((1, 8, 32, 32, 3)))


@pytest.mark.parametrize("encoder", ["joint", "factorised"])
def test_flops_match_xla_cost_analysis_within_2_percent(encoder):
    kw = dict(TINY, num_frames=8)
    cfg = video_config("ViViT-B/8x2", encoder=encoder, temporal_depth=1 if encoder == "factorised" else 0, **kw)
    assert xla_flops_per_clip(build_model(cfg), cfg.input_shape) == pytest.approx(model_flops(cfg).forward, rel=0.02)


@pytest.fixture(scope="module")
def joint_gap():
    cfg = video_config("ViViT-B/8x2", pool="gap", **TINY)
    model = build_model(cfg)
    return cfg, model, model.init(jax.random.key(0))


@pytest.mark.parametrize("method", ["central", "average"])
def test_an_inflated_image_vit_predicts_a_still_clip_as_the_image(joint_gap, method):
    # Exact where every token repeats nt times: softmax attention over keys each repeated nt times is attention
    # over the keys once, and the mean over tokens is unchanged. (A class token, which does not repeat, would get a
    # smaller share of every query's attention: with pool="token" the clip predicts only near the image.)
    cfg, model, video_init = joint_gap
    image_cfg = vit_config(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=8, image_size=32, num_classes=10,
                           pool="gap")
    image_model = build_model(image_cfg)
    image_params = image_model.init(jax.random.key(2))
    image_params["head"]["kernel"] = jax.random.normal(jax.random.key(3), (64, 10))  # a head that is not zero
    params = inflate_image_vit(image_cfg, image_params, cfg, video_init, method)
    image = jax.random.uniform(jax.random.key(4), (3, 32, 32, 3), minval=-1, maxval=1)
    clip = jnp.repeat(image[:, None], cfg.num_frames, axis=1)
    expect, _ = image_model.apply(image_params, image)
    got, _ = model.apply(params, clip)
    assert float(jnp.abs(expect).max()) > 0.1
    np.testing.assert_allclose(got, expect, atol=1e-5)
    with pytest.raises(InflationError, match="width 32 vs 64"):
        inflate_image_vit(image_cfg.replace(width=32, num_heads=2), image_params, cfg, video_init)
    if method == "central":  # init.checkpoint of an image ViT: fine-tune surgery inflates it (a registered converter)
        tuned, notes = adapt_params(image_params, image_cfg, video_init, cfg)
        assert np.array_equal(tuned["embedding"]["kernel"][1], image_params["embedding"]["kernel"])
        assert not np.asarray(tuned["embedding"]["kernel"][0]).any() and not np.asarray(tuned["head"]["kernel"]).any()
        assert any("inflated the patch kernel to 2 frames (central frame)" in n for n in notes)


def test_multi_view_evaluation_classifies_each_clip_by_its_views_mean_logits(joint):
    from vit_jax.eval.inference import predict
    from vit_jax.eval.steps import features_step, make_eval_step
    from vit_jax.models.losses import LOSSES

    cfg, model, params = joint
    params = {**params, "head": {**params["head"], "kernel": jax.random.normal(jax.random.key(5), (64, 10))}}
    views = jax.random.uniform(jax.random.key(6), (3, 2, *cfg.input_shape), minval=-1, maxval=1)  # 3 clips x 2 views
    flat = views.reshape(6, *cfg.input_shape)
    logits, aux = jax.jit(model.apply)(params, flat)
    mean = logits.reshape(3, 2, 10).mean(1)
    label = jnp.array([int(jnp.argmax(mean[0])), int(jnp.argmin(mean[1])), 0])
    labels = jax.nn.one_hot(label, 10)
    # the loss of the mean logits, which neither one view's loss nor the mean of the views' losses equals
    per_view = LOSSES["softmax_xent"](logits, jnp.repeat(labels, 2, axis=0)).reshape(3, 2)
    assert min(abs(float(per_view.mean(1).sum() - LOSSES["softmax_xent"](mean, labels).sum())),
               abs(float(per_view[:, 0].sum() - LOSSES["softmax_xent"](mean, labels).sum()))) > 1e-2
    sums = jax.jit(make_eval_step(model))(params, {"image": views, "labels": labels, "label": label,
                                                   "_mask": jnp.ones(3)})
    assert float(sums["top1"]) == float((jnp.argmax(mean, -1) == label).sum()) and float(sums["count"]) == 3
    np.testing.assert_allclose(float(sums["loss"]), float(LOSSES["softmax_xent"](mean, labels).sum()), rtol=1e-5)
    np.testing.assert_allclose(jax.jit(features_step(model))(params, views),
                               aux["pre_logits"].reshape(3, 2, -1).mean(1), atol=1e-5)
    np.testing.assert_allclose(predict(params, cfg, np.asarray(views)), mean, atol=1e-5)  # vit-jax predict's path
    with pytest.raises(ValueError, match=r"takes inputs of shape \(batch, 4, 32, 32, 3\) or views of them"):
        make_eval_step(model)(params, {"image": views[:, :, None], "labels": labels, "label": label,
                                       "_mask": jnp.ones(3)})
