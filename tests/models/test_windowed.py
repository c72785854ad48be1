"""Windowed attention, decomposed relative positions and dense outputs (SAM-style ViT backbones)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import vit_config
from vit_jax.models.config import ModelConfigError
from vit_jax.models.vit import FunctionalViT, scan_period
from vit_jax.models.windows import resize_rel_pos

SAM_B = dict(image_size=1024, window_size=14, global_blocks=(2, 5, 8, 11), rel_pos=True, dense=True)
# 5x5 grid, 3x3 windows: the grid is padded to 6x6, so the padding path is exercised; block 1 is global.
TINY_SAM = dict(width=32, depth=4, mlp_dim=64, num_heads=2, patch_size=8, image_size=40, window_size=3,
                global_blocks=(1, 3), rel_pos=True, dense=True, neck_dim=16, gelu="erf")


def test_sam_b_parameter_counts_and_output_shape():
    """timm's samvit_base_patch16 (timm 1.0.31): 89,670,912 parameters with the neck, 88,883,456 without."""
    for neck, expected, channels in ((256, 89_670_912, 256), (0, 88_883_456, 768)):
        f = FunctionalViT(vit_config("B/16", neck_dim=neck, **SAM_B))
        assert f.num_params() == expected
        out, aux = jax.eval_shape(lambda p, x: f.apply(p, x), f.shapes,
                                  jax.ShapeDtypeStruct((1, 1024, 1024, 3), jnp.float32))
        assert out.shape == (1, 64, 64, channels) and aux["tokens"].shape == (1, 64, 64, 768)
    cfg = vit_config("B/16", **SAM_B)
    assert scan_period(cfg) == 3
    shapes = FunctionalViT(cfg).shapes["encoder"]
    assert shapes["rel_pos_0"]["h"].shape == (27, 64) and shapes["rel_pos_2"]["w"].shape == (127, 64)
    assert "norm" not in shapes or shapes["norm"] is None


@pytest.mark.parametrize("kw, match", [
    (dict(window_size=-1), "window_size"),
    (dict(window_size=14, global_blocks=(12,)), "global_blocks"),
    (dict(global_blocks=(1,), pool="gap"), "window_size=0"),
    (dict(window_size=14, pool="token"), "class token"),
    (dict(dense=True, num_classes=10), "dense=True"),
    (dict(neck_dim=256), "neck_dim"),
])
def test_invalid_spatial_options_are_one_line_errors(kw, match):
    with pytest.raises(ModelConfigError, match=match) as e:
        vit_config("B/16", **kw)
    assert "\n" not in str(e.value)


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _ln(x, scale, bias, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * scale + bias


def _reference(p, cfg, img):
    """SAM's image encoder written out in numpy, window by window (independent of vit_jax.models.windows)."""
    ph = cfg.patch_size[0]
    gh, gw = cfg.grid
    d, nh = cfg.width, cfg.num_heads
    hd = d // nh
    patches = img.reshape(gh, ph, gw, ph, 3).transpose(0, 2, 1, 3, 4).reshape(gh, gw, -1)
    x = patches @ p["embedding"]["kernel"].reshape(-1, d) + p["embedding"]["bias"]
    x = x + p["pos_embedding"].reshape(gh, gw, d)
    blocks = p["encoder"]["blocks"]
    for i in range(cfg.depth):
        b = {k: jax.tree.map(lambda a: np.asarray(a[i]), v) for k, v in blocks.items()}
        tab = p["encoder"][f"rel_pos_{i}"]
        y = _ln(x, b["ln1"]["scale"], b["ln1"]["bias"])
        ws = gh if cfg.is_global(i) else cfg.window_size
        hp, wp = -(-gh // ws) * ws, -(-gw // ws) * ws
        padded = np.zeros((hp, wp, d), np.float32)
        padded[:gh, :gw] = y
        result = np.zeros_like(padded)
        for r0 in range(0, hp, ws):
            for c0 in range(0, wp, ws):
                win = padded[r0:r0 + ws, c0:c0 + ws].reshape(-1, d)
                q, k, v = (np.einsum("td,dhk->htk", win, b["attn"][n]["kernel"]) + b["attn"][n]["bias"][:, None]
                           for n in ("query", "key", "value"))
                logits = np.einsum("hqc,hkc->hqk", q, k) / math.sqrt(hd)
                pos = [(a, c) for a in range(ws) for c in range(ws)]
                for qi, (qa, qc) in enumerate(pos):
                    for ki, (ka, kc) in enumerate(pos):
                        rh, rw = tab["h"][qa - ka + ws - 1], tab["w"][qc - kc + ws - 1]
                        logits[:, qi, ki] += q[:, qi] @ rh + q[:, qi] @ rw
                w = np.exp(logits - logits.max(-1, keepdims=True))
                w /= w.sum(-1, keepdims=True)
                o = np.einsum("hqk,hkc->qhc", w, v)
                o = np.einsum("qhc,hcd->qd", o, b["attn"]["out"]["kernel"]) + b["attn"]["out"]["bias"]
                result[r0:r0 + ws, c0:c0 + ws] = o.reshape(ws, ws, d)
        x = x + result[:gh, :gw]
        y = _ln(x, b["ln2"]["scale"], b["ln2"]["bias"])
        y = _gelu(y @ b["mlp"]["fc1"]["kernel"] + b["mlp"]["fc1"]["bias"])
        x = x + y @ b["mlp"]["fc2"]["kernel"] + b["mlp"]["fc2"]["bias"]
    n = p["neck"]
    y = _ln(x @ n["conv1"][0, 0], n["ln1"]["scale"], n["ln1"]["bias"])
    yp = np.pad(y, ((1, 1), (1, 1), (0, 0)))
    z = sum(yp[a:a + gh, c:c + gw] @ n["conv2"][a, c] for a in range(3) for c in range(3))
    return x, _ln(z, n["ln2"]["scale"], n["ln2"]["bias"])


@pytest.fixture(scope="module")
def tiny_sam():
    cfg = vit_config(**TINY_SAM)
    # Random values for every parameter (relative position tables and norms included, which init to constants), so
    # that every term shows in the comparison; no init needed, only the shapes.
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda a: (0.3 * rng.normal(size=a.shape)).astype(np.float32), FunctionalViT(cfg).shapes)
    images = rng.uniform(-1, 1, (2, 40, 40, 3)).astype(np.float32)
    return cfg, params, images


@pytest.mark.parametrize("layout", [dict(), dict(scan=True, remat="full")], ids=["unrolled", "scan_groups"])
def test_windowed_model_equals_sam_reference(tiny_sam, layout):
    cfg, params, images = tiny_sam
    assert scan_period(cfg) == 2  # scan: 2 groups of (windowed, global)
    f = FunctionalViT(cfg.replace(**layout))
    out, aux = jax.jit(lambda p, x: f.apply(p, x))(params, images)
    assert out.shape == (2, 5, 5, 16) and aux["tokens"].shape == (2, 5, 5, 32)
    for b in range(2):
        tokens, dense = _reference(params, cfg, images[b])
        np.testing.assert_allclose(aux["tokens"][b], tokens, atol=2e-4, rtol=1e-4)
        np.testing.assert_allclose(out[b], dense, atol=2e-4, rtol=1e-4)


def test_scan_over_groups_gradients_equal_unrolled():
    # One scanned (windowed, global) group at a 3x3 grid in 2x2 windows (the forward test above runs two groups;
    # one keeps this compile small): padding in the windowed block, per-block tables stacked for the scan.
    cfg = vit_config(width=16, depth=2, mlp_dim=32, num_heads=2, patch_size=8, image_size=24, window_size=2,
                     global_blocks=(1,), rel_pos=True, dense=True)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: rng.normal(size=a.shape).astype(np.float32) * 0.3, FunctionalViT(cfg).shapes)
    images = rng.uniform(-1, 1, (2, 24, 24, 3)).astype(np.float32)

    def grads(c):
        f = FunctionalViT(c)
        return jax.jit(jax.grad(lambda p: jnp.mean(f.apply(p, images)[0] ** 2)))(params)

    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4),
                 grads(cfg.replace(scan=True, remat="full")), grads(cfg))


def test_rel_pos_resize_is_torch_linear_interpolation():
    """torch.nn.functional.interpolate(mode='linear', align_corners=False), as SAM's get_rel_pos resizes tables."""
    table = np.random.default_rng(0).normal(size=(7, 3)).astype(np.float32)

    def torch_linear(t, n):
        scale = t.shape[0] / n
        src = np.maximum((np.arange(n) + 0.5) * scale - 0.5, 0)
        lo = np.minimum(np.floor(src).astype(int), t.shape[0] - 1)
        hi = np.minimum(lo + 1, t.shape[0] - 1)
        frac = (src - lo)[:, None]
        return t[lo] * (1 - frac) + t[hi] * frac

    for n in (13, 5, 7):
        np.testing.assert_allclose(resize_rel_pos(jnp.asarray(table), n), torch_linear(table, n), atol=1e-6)


def test_windowed_model_sharded_over_data_fsdp_tensor_equals_one_device(tiny_sam):
    """Windows fold into the batch axis and heads split over `tensor`: the sharded forward is the same function."""
    from vit_jax.parallel import mesh as mesh_lib

    cfg, params, images = tiny_sam
    images = np.concatenate([images, -images])  # 4 images: one per data x fsdp shard
    f = FunctionalViT(cfg)
    want = jax.jit(f.apply)(params, images)
    m = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
    sh = mesh_lib.tree_shardings(f.logical_axes, f.shapes, m)
    assert any(s.spec != jax.sharding.PartitionSpec() for s in jax.tree.leaves(sh))  # something is sharded
    got = jax.jit(f.apply, in_shardings=(sh, mesh_lib.batch_sharding(m)))(jax.device_put(params, sh), images)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), got, want)


# Windowed attention needs a grid without a class token: pool "token" exists only with global blocks (a config error
# otherwise, tested above).
@pytest.mark.parametrize("pool,windowed", [("token", False), ("gap", False), ("map", False), ("gap", True),
                                           ("map", True)])
def test_finetuning_at_a_higher_resolution_for_every_pool(pool, windowed):
    """#16 item 5: a model pretrained at 24 px fine-tunes at 40 px (3x3 -> 5x5 patch grid) with every pooling, with
    windowed blocks and relative positions or without: the surgery resizes the position embedding and the global
    blocks' rel-pos tables (window tables keep their size), and a training step on the new size has finite,
    non-zero gradients everywhere but the zero head's input side."""
    from vit_jax.checkpoints.surgery import adapt_params
    from vit_jax.checkpoints.layouts import flatten
    from vit_jax.train.objectives import Classification

    spatial = dict(window_size=2, global_blocks=(1,), rel_pos=True) if windowed else {}
    src_cfg = vit_config(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8, image_size=24, pool=pool,
                         num_classes=5, **spatial)
    target = src_cfg.replace(image_size=40, num_classes=3)
    src = FunctionalViT(src_cfg).init(jax.random.key(0))
    params, notes = adapt_params(jax.device_get(src), src_cfg, FunctionalViT(target).init(jax.random.key(1)), target)
    flat_src, flat = flatten(jax.device_get(src)), flatten(params)
    assert flat["pos_embedding"].shape[-2] == (1 if pool == "token" else 0) + 25
    assert any("resized pos_embedding (3, 3) -> (5, 5)" in n for n in notes)
    if windowed:
        assert flat["encoder/rel_pos_1/h"].shape[0] == 2 * 5 - 1  # global block: follows the grid (3x3 -> 5x5)
        np.testing.assert_array_equal(flat["encoder/rel_pos_0/h"], flat_src["encoder/rel_pos_0/h"])  # window: kept
    assert not flat["head/kernel"].any()

    objective = Classification(FunctionalViT(target))
    rng = np.random.default_rng(0)
    inputs = {"image": jnp.asarray(rng.uniform(-1, 1, (4, 40, 40, 3)), jnp.float32),
              "labels": jax.nn.one_hot(jnp.arange(4) % 3, 3)}
    loss, grads = jax.jit(jax.value_and_grad(objective.loss))(params, inputs, jax.random.key(2))
    assert float(loss) == pytest.approx(np.log(3), abs=1e-5)  # zero head: uniform over the 3 new classes
    g = flatten(jax.device_get(grads))
    assert all(np.isfinite(v).all() for v in g.values())
    assert np.abs(g["head/kernel"]).max() > 0 and np.abs(g["head/bias"]).max() > 0
