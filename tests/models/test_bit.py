"""The BiT ResNet-v2 family: names, parameter counts (timm's), options, FLOPs against XLA's count."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.xla_cost import xla_flops_per_image
from vit_jax.models.bit_config import ModelConfigError, bit_config, is_bit_name, parse_bit_name
from vit_jax.models.build import build_model
from vit_jax.models.build import model_flops
from vit_jax.models.flops import bit_flops

# timm 1.0.31's resnetv2_*_bit with 1000 classes (sum of numel over model.parameters()).
TIMM_PARAMS = {"BiT-R50x1": 25_549_352, "R101x1": 44_541_480, "R50x3": 217_319_080, "R152x2": 236_335_208}

TINY = dict(layers=(1, 1), num_classes=5, image_size=32)


@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_param_counts_match_timm(name):
    assert build_model(bit_config(name, num_classes=1000)).num_params() == TIMM_PARAMS[name]


def test_names():
    assert parse_bit_name("BiT-R50x1") == dict(layers=(3, 4, 6, 3), width_factor=1)
    assert parse_bit_name("R200x3") == dict(layers=(3, 24, 36, 3), width_factor=3)
    assert parse_bit_name("R152x4")["layers"] == (3, 8, 36, 3)
    assert bit_config("R101x3").name == "BiT-R101x3"
    assert bit_config("R50x1", width_factor=7).name == "BiT-R50x7"  # any width
    assert bit_config(layers=(1, 1)).name == "BiT-R1-1x1"
    assert parse_bit_name("BiT-R1-1x2") == dict(layers=(1, 1), width_factor=2)  # the name of a custom one parses back
    assert is_bit_name("BiT-R50x1") and is_bit_name("R152x2")
    assert not is_bit_name("R50+B/16") and not is_bit_name("B/16")


@pytest.mark.parametrize("bad,match", [
    (lambda: parse_bit_name("R51x1"), "no BiT ResNet of depth 51"),
    (lambda: parse_bit_name("ResNet50"), "unknown BiT model"),
    (lambda: bit_config(layers=(3, 0)), "at least one unit"),
    (lambda: bit_config("R50x1", width_factor=0), "width_factor=0"),
    (lambda: bit_config("R50x1", remat="some"), "remat='some' is not one of"),
    (lambda: bit_config("R50x1", dtype="int8"), "dtype='int8'"),
])
def test_bad_settings_are_one_line_errors(bad, match):
    with pytest.raises(ModelConfigError, match=match) as e:
        bad()
    assert "\n" not in str(e.value)


def random_params(model, seed=0):
    """Random weights everywhere (the zero-initialised head would hide most of the function); numpy, no compile."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.2, s.shape), s.dtype), model.shapes)


def test_forward_parameter_tree_and_logical_axes():
    cfg = bit_config(**TINY)
    model = build_model(cfg)
    params = random_params(model)  # the initialiser (zero head) is tested by the 2-step training run's first loss
    assert sorted(params) == ["block1", "block2", "conv_root", "head", "norm"]
    assert "conv_proj" in params["block1"]["unit1"] and "conv_proj" in params["block2"]["unit1"]
    assert "conv_proj" not in params["block2"].get("unit2", {})
    assert model.logical_axes["block2"]["unit1"]["conv2"]["kernel"] == (None, None, "conv_in", "conv_out")
    assert model.logical_axes["head"]["kernel"] == ("conv_out", "vocab")
    images = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), minval=-1, maxval=1)
    apply = jax.jit(model.apply)
    logits, out = apply(params, images)
    assert logits.shape == (2, 5) and out["pre_logits"].shape == (2, cfg.out_channels) == (2, 512)
    assert float(jnp.abs(logits).max()) > 0
    # Parameters do not depend on the resolution: the same weights run at another size.
    assert apply(params, images[:, :24, :24])[0].shape == (2, 5)


def test_remat_gives_the_same_gradients():
    cfg = bit_config(layers=(1,), num_classes=5, image_size=16)
    plain, remat = build_model(cfg), build_model(cfg.replace(remat="full"))
    params = random_params(plain)
    images = jax.random.uniform(jax.random.key(1), (2, 16, 16, 3), minval=-1, maxval=1)

    def grads(model):
        return jax.jit(jax.grad(lambda p: model.apply(p, images)[0].sum()))(params)

    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads(plain), grads(remat))


def test_flops_match_xla_cost_analysis_within_2_percent():
    # Three one-unit stages at 96 px keep the compile short (four at 224 px measured 0.5% apart, at 128 px 1.6%: XLA
    # skips the padded taps of small maps, which the analytic count includes).
    cfg = bit_config(layers=(1, 1, 1), image_size=96, num_classes=1000)
    # Per image = what one more image costs (weight standardisation is done once per batch).
    assert xla_flops_per_image(build_model(cfg), cfg.image_size) == pytest.approx(bit_flops(cfg).forward, rel=0.02)
    assert model_flops(cfg) == bit_flops(cfg)


def test_r50x1_flops_at_224():
    # 4.1 GMACs, ResNet-50's well-known figure (torchvision: 4.09 GMACs; its projection shortcuts sit in the same place).
    assert bit_flops(bit_config("R50x1", num_classes=1000)).forward / 2 == pytest.approx(4.1e9, rel=0.01)
