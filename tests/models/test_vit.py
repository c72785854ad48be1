"""The ViT family: variants, parameter counts, options, and numerical equivalences of the execution paths."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vit_jax.models import ViTConfig, parse_variant, vit_config
from vit_jax.models import layers as L
from vit_jax.models.vit import FunctionalViT

# Token classifier, 1000 classes, 224 px. The first seven equal the official code's counts (issue text / vit_jax);
# the rest are pinned from this implementation so a change to the architecture cannot pass unnoticed.
PINNED_PARAMS = {
    "Ti/16": 5_717_416, "S/16": 22_050_664, "B/16": 86_567_656, "B/32": 88_224_232, "L/16": 304_326_632,
    "H/14": 632_045_800, "R50+B/16": 98_659_112,
    "S/32": 22_878_952, "M/16": 38_837_736, "L/32": 306_535_400, "g/14": 1_012_611_432, "G/14": 1_844_440_680,
    "R26+S/32": 36_431_912, "R50+L/32": 328_994_856,
}

TINY = dict(width=64, depth=2, mlp_dim=128, num_heads=4, patch_size=8, image_size=32, num_classes=10)


@pytest.mark.parametrize("variant", sorted(PINNED_PARAMS))
def test_param_counts_are_pinned(variant):
    cfg = vit_config(variant, num_classes=1000, image_size=224)
    assert FunctionalViT(cfg).num_params() == PINNED_PARAMS[variant]


def test_variant_strings():
    assert parse_variant("B/16") == dict(width=768, depth=12, mlp_dim=3072, num_heads=12, patch_size=(16, 16))
    assert parse_variant("Ti/8")["patch_size"] == (8, 8)
    assert parse_variant("ViT-L/32")["width"] == 1024
    hybrid = parse_variant("R50+B/16")
    assert hybrid["resnet_layers"] == (3, 4, 9) and hybrid["patch_size"] == (1, 1)
    assert parse_variant("R26+S/32")["resnet_layers"] == (2, 2, 2, 2)
    assert vit_config("R50+B/16").name == "R50+ViT-B/16"
    assert vit_config("B/16", width=512, num_heads=8).width == 512  # custom sizes by keyword
    with pytest.raises(ValueError, match="unknown ViT variant"):
        parse_variant("Q/16")
    with pytest.raises(ValueError, match="not divisible by patch size"):
        vit_config("B/16", image_size=100)
    with pytest.raises(ValueError, match="pool"):
        vit_config("B/16", pool="avg")


def _forward(cfg: ViTConfig, params, x, **kw):
    f = FunctionalViT(cfg)
    return jax.jit(lambda p, x: f.apply(p, x, **kw))(params, x)


@pytest.fixture(scope="module")
def tiny():
    cfg = vit_config(**TINY)
    f = FunctionalViT(cfg)
    params = f.init(jax.random.key(0))
    # Non-zero head so that logits carry information in the comparisons below.
    params["head"]["kernel"] = jax.random.normal(jax.random.key(1), params["head"]["kernel"].shape)
    x = jax.random.uniform(jax.random.key(2), (3, 32, 32, 3), minval=-1, maxval=1)
    return cfg, params, x


def test_scan_remat_and_unrolled_agree(tiny):
    cfg, params, x = tiny
    ref, _ = _forward(cfg, params, x)
    for kw in (dict(scan=True), dict(remat="full"), dict(scan=True, remat="dots"), dict(remat="dots_no_batch")):
        out, _ = _forward(cfg.replace(**kw), params, x)
        np.testing.assert_allclose(out, ref, atol=1e-5, err_msg=str(kw))


def test_scan_gradients_match_unrolled(tiny):
    cfg, params, x = tiny

    def loss(cfg):
        f = FunctionalViT(cfg)
        return jax.jit(jax.grad(lambda p: jnp.sum(f.apply(p, x)[0] ** 2)))(params)

    g_ref = loss(cfg)
    g_scan = loss(cfg.replace(scan=True, remat="full"))
    # The same fp32 sums in another order: their rounding differences scale with the gradients (the largest entries are
    # ~1e2; one entry of 12,288 differed by 1.7e-4 under the tests' compile flags, and entries whose true value is 0
    # come out as rounding noise), so the absolute tolerance is relative to the largest gradient entry. A wrong layer
    # order or remat bug moves entries by their own size.
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(g_ref))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale), g_ref, g_scan)


def test_fused_attention_equals_softmax_path():
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 17, 4, 16)) for i in range(3))
    fused, _ = L.attention(q, k, v)
    explicit, weights = L.attention(q, k, v, return_weights=True)
    np.testing.assert_allclose(fused, explicit, atol=1e-5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    manual = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / 4.0, -1)
    np.testing.assert_allclose(weights, manual, atol=1e-6)
    # The layer's path is jax.nn.dot_product_attention's computation (cuDNN's kernel on GPU, XLA's elsewhere).
    np.testing.assert_allclose(fused, jax.nn.dot_product_attention(q, k, v), atol=1e-5)
    np.testing.assert_allclose(fused, jax.nn.dot_product_attention(q, k, v, implementation="xla"), atol=1e-5)


def test_intermediates_and_capture(tiny):
    cfg, params, x = tiny
    logits, out = _forward(cfg, params, x, capture=("blocks", "attention"))
    t = cfg.seq_len
    assert logits.shape == (3, 10)
    assert out["pre_logits"].shape == (3, 64)
    assert out["encoded"].shape == (3, t, 64)
    assert out["blocks"].shape == (2, 3, t, 64)
    assert out["attention"].shape == (2, 3, 4, t, t)
    np.testing.assert_allclose(out["attention"].sum(-1), 1.0, atol=1e-5)
    # The head reads the class token of the final encoder output.
    np.testing.assert_allclose(out["pre_logits"], out["encoded"][:, 0], atol=1e-6)
    scan_logits, scan_out = _forward(cfg.replace(scan=True), params, x, capture=("blocks", "attention"))
    np.testing.assert_allclose(scan_out["attention"], out["attention"], atol=1e-5)


@pytest.mark.parametrize("opts", [
    dict(pool="gap"), dict(pool="map"), dict(posemb="sincos2d"), dict(pool="gap", posemb="sincos2d"),
    dict(rep_size=32), dict(gelu="erf"), dict(image_size=(32, 48)), dict(patch_size=(4, 8)),
])
def test_options_build_and_run(opts):
    cfg = vit_config(**{**TINY, **opts})
    f = FunctionalViT(cfg)
    params = f.init(jax.random.key(0))
    logits, out = jax.jit(f.apply)(params, jnp.zeros((2, *cfg.image_size, 3)))
    assert logits.shape == (2, 10) and np.isfinite(np.asarray(logits)).all()
    expected_feat = cfg.rep_size or cfg.width
    assert out["pre_logits"].shape == (2, expected_feat)
    if cfg.posemb == "sincos2d":
        assert "pos_embedding" not in params
    if cfg.pool != "token":
        assert "cls" not in params


def test_head_is_zero_initialised_with_bias():
    cfg = vit_config(**TINY, head_bias_init=-10.0)
    params = FunctionalViT(cfg).init(jax.random.key(0))
    assert not np.any(np.asarray(params["head"]["kernel"]))
    np.testing.assert_array_equal(params["head"]["bias"], -10.0)


def test_dropout_and_drop_path_are_keyed_and_off_in_eval(tiny):
    cfg, params, x = tiny
    cfg = cfg.replace(dropout=0.1, attention_dropout=0.1, drop_path=0.2)
    f = FunctionalViT(cfg)
    run = jax.jit(lambda p, x, k: f.apply(p, x, train=True, rng=k)[0])
    a = run(params, x, jax.random.key(5))
    b = run(params, x, jax.random.key(5))
    c = run(params, x, jax.random.key(6))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    # Same key, scanned: identical masks (keys are split per block the same way).
    fs = FunctionalViT(cfg.replace(scan=True))
    np.testing.assert_allclose(jax.jit(lambda p, x, k: fs.apply(p, x, train=True, rng=k)[0])(
        params, x, jax.random.key(5)), a, atol=1e-5)
    eval_out = jax.jit(lambda p, x: f.apply(p, x)[0])(params, x)
    ref = jax.jit(lambda p, x: FunctionalViT(tiny[0]).apply(p, x)[0])(params, x)
    np.testing.assert_allclose(eval_out, ref, atol=1e-6)
    with pytest.raises(ValueError, match="rng"):
        f.apply(params, x, train=True)


def test_drop_path_rates_increase_linearly_over_the_blocks(monkeypatch):
    # The layer drops a fraction `rate` of the examples ...
    x = jnp.ones((4000, 1))
    kept = [float((L.drop_path(x, r, jax.random.key(0)) != 0).mean()) for r in (0.0, 0.1, 0.5)]
    assert kept[0] == 1.0 and abs(kept[1] - 0.9) < 0.03 and abs(kept[2] - 0.5) < 0.03
    # ... and block i of a depth-d model gets drop_path * i / (d - 1): 0 for the first block, the full rate last.
    seen = []
    real = L.drop_path

    def record(y, rate, key):
        seen.append(rate)
        return real(y, rate, key)

    monkeypatch.setattr(L, "drop_path", record)
    cfg = vit_config(width=32, depth=5, mlp_dim=64, num_heads=2, patch_size=8, image_size=16, num_classes=3,
                     drop_path=0.4)
    f = FunctionalViT(cfg)
    params = f.init(jax.random.key(0))
    out = f.apply(params, jnp.ones((2, 16, 16, 3)), train=True, rng=jax.random.key(1))[0]
    assert out.shape == (2, 3)
    per_block = [float(r) for r in jnp.stack(seen[::2])]  # two residual branches per block share the rate
    np.testing.assert_allclose(per_block, [0.0, 0.1, 0.2, 0.3, 0.4], atol=1e-7)


def test_bf16_compute_keeps_fp32_params(tiny):
    cfg, params, x = tiny
    f = FunctionalViT(cfg.replace(dtype="bfloat16"))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(f.shapes))
    logits, out = jax.jit(f.apply)(params, x)
    assert out["encoded"].dtype == jnp.bfloat16
    ref, _ = _forward(cfg, params, x)
    np.testing.assert_allclose(logits, ref, atol=0.15, rtol=0.05)


def test_every_parameter_has_logical_axes():
    cfg = vit_config("R26+S/32", pool="map", rep_size=16, image_size=64, num_classes=3)
    f = FunctionalViT(cfg)
    shapes = jax.tree.leaves(f.shapes)
    axes = jax.tree.leaves(f.logical_axes, is_leaf=lambda a: isinstance(a, tuple))
    assert len(shapes) == len(axes)
    for s, a in zip(shapes, axes):
        assert len(a) == len(s.shape)
    blocks = f.logical_axes["encoder"]["blocks"]
    assert blocks["mlp"]["fc1"]["kernel"] == ("layers", "embed", "mlp")
    assert blocks["attn"]["query"]["kernel"] == ("layers", "embed", "heads", "kv")
    assert f.logical_axes["head"]["kernel"] == ("embed", "vocab")


def test_scan_compiles_one_block_for_deep_models():
    # The compile-time claim (H/14 compiles far faster scanned) is measured in the benchmark; here its cause:
    # the scanned program holds one block, the unrolled one holds `depth` copies.
    cfg = vit_config(width=32, depth=16, mlp_dim=64, num_heads=2, patch_size=8, image_size=16, num_classes=2)
    x = jax.ShapeDtypeStruct((1, 16, 16, 3), jnp.float32)

    def hlo_size(c):
        f = FunctionalViT(c)
        step = jax.jit(jax.grad(lambda p, x: f.apply(p, x)[0].sum()))
        return len(step.lower(f.shapes, x).as_text())

    assert hlo_size(cfg) > 5 * hlo_size(cfg.replace(scan=True))


def test_wrong_resolution_is_a_clear_error(tiny):
    cfg, params, _ = tiny
    with pytest.raises(ValueError, match="patch grid"):
        FunctionalViT(cfg).apply(params, jnp.zeros((1, 64, 64, 3)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dense_gradients_on_cpu_equal_autodiffs_einsum(dtype):
    # On CPU, Linear's kernel gradient is computed as (dy^T @ x)^T (see layers._matmul_row_major_grads): the same
    # values as the plain einsum's autodiff, for (B, T, in) inputs in either compute dtype.
    x = jax.random.normal(jax.random.key(0), (3, 5, 16), dtype)
    kernel = jax.random.normal(jax.random.key(1), (16, 24), dtype)
    cot = jax.random.normal(jax.random.key(2), (3, 5, 24), dtype)
    ours = jax.grad(lambda x, k: jnp.sum(L._cpu_dense(x, k).astype(jnp.float32) * cot), argnums=(0, 1))(x, kernel)
    ref = jax.grad(lambda x, k: jnp.sum(L._dense(x, k).astype(jnp.float32) * cot), argnums=(0, 1))(x, kernel)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype == dtype
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)


def test_dense_kernel_gradient_is_a_ynnpack_product_on_cpu_and_autodiffs_elsewhere():
    # What the custom gradient is for: XLA:CPU hands the kernel gradient to YNNPACK (a fusion) rather than to Eigen
    # (a bare dot, which is what the plain einsum's gradient compiles to). Lowered for another platform, Linear is
    # the plain einsum.
    layer = L.Linear(384, 1536, ("embed", "mlp"), kernel_init=L.zeros, param_dtype=jnp.float32,
                     rngs=nnx.Rngs(0))
    x = jnp.ones((2, 197, 384))

    def grads(dense):
        return jax.jit(jax.grad(lambda x, k: jnp.sum(dense(x, k) ** 2), argnums=1)).lower(x, layer.kernel[...])

    def bare_dots(compiled_text):
        return re.findall(r"^\s*(?:ROOT )?%\S+ = f32\[384,1536\]\S* dot\(", compiled_text, re.M)

    plain, ours = (grads(dense).compile().as_text() for dense in (L._dense, L._cpu_dense))
    assert bare_dots(plain), "the plain einsum's kernel gradient is no longer an Eigen dot: re-measure"
    assert not bare_dots(ours)
    assert "__ynn_fusion" in ours
    tpu_text = jax.jit(lambda x: layer(x)).trace(x).lower(lowering_platforms=("tpu",)).as_text()
    assert "optimization_barrier" not in tpu_text and "custom_vjp" not in tpu_text
