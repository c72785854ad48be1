"""Official-checkpoint interop: golden parity, layout round trips, timm export, surgery, convert/predict commands."""

import re

import numpy as np
import pytest
from PIL import Image

from tests.conftest import GOLDEN, GOLDEN_CASES
from vit_jax import cli
from vit_jax.checkpoints.layouts import CheckpointMismatchError, flatten, load_npz, save_npz, to_layout
from vit_jax.checkpoints.loading import load_any
from vit_jax.checkpoints.npz import load_npz_params, save_npz_params
from vit_jax.checkpoints.surgery import adapt_params, resize_posemb
from vit_jax.checkpoints.timm import load_timm, save_timm, to_timm
from vit_jax.models import vit_config
from vit_jax.models.vit import FunctionalViT
from vit_jax.eval.inference import predict


def _golden(name):
    with np.load(GOLDEN / f"{name}.io.npz") as z:
        return z["images"], z["logits"]


def _assert_same_flat(a, b):
    fa, fb = flatten(a), flatten(b)
    assert sorted(fa) == sorted(fb)
    for k in fa:
        assert fa[k].dtype == fb[k].dtype and np.array_equal(fa[k], fb[k]), k


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_predict_command_matches_reference_logits(name, tmp_path):
    out = tmp_path / "logits.npy"
    rc = cli.main(["predict", "--checkpoint", str(GOLDEN / f"{name}.npz"),
                   "--images", str(GOLDEN / f"{name}.io.npz"), "--output", str(out)])
    assert rc == 0
    _, ref = _golden(name)
    assert np.abs(np.load(out) - ref).max() <= 1e-4


def test_architecture_is_inferred_from_the_checkpoint():
    token, _ = load_npz_params(str(GOLDEN / "tiny_token.npz"))
    assert (token.width, token.depth, token.num_heads, token.mlp_dim, token.patch_size, token.pool,
            token.num_classes, token.image_size) == (64, 3, 4, 128, (8, 8), "token", 10, (32, 32))
    gap, _ = load_npz_params(str(GOLDEN / "tiny_gap_rep.npz"))
    assert (gap.pool, gap.rep_size, gap.num_classes) == ("gap", 32, 7)
    hybrid, _ = load_npz_params(str(GOLDEN / "tiny_hybrid.npz"))
    assert (hybrid.resnet_layers, hybrid.resnet_width, hybrid.patch_size, hybrid.depth) == ((1, 1), 1, (1, 1), 2)


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_official_round_trip_is_bit_identical(name, tmp_path):
    cfg, params = load_npz_params(str(GOLDEN / f"{name}.npz"))
    save_npz_params(str(tmp_path / "a.npz"), params, cfg)
    raw_in, raw_out = load_npz(str(GOLDEN / f"{name}.npz")), load_npz(str(tmp_path / "a.npz"))
    assert sorted(raw_in) == sorted(raw_out)
    for k in raw_in:
        assert raw_in[k].dtype == raw_out[k].dtype and np.array_equal(raw_in[k], raw_out[k]), k
    cfg2, params2 = load_npz_params(str(tmp_path / "a.npz"))
    assert cfg2 == cfg
    _assert_same_flat(params, params2)


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_big_vision_layout_gives_the_same_model(name, tmp_path):
    cfg, params = load_npz_params(str(GOLDEN / f"{name}.npz"))
    flat_bv = to_layout({k: np.asarray(v) for k, v in flatten(params).items()}, cfg, "big_vision")
    assert "pos_embedding" in flat_bv and not any("MultiHeadDotProductAttention_1" in k for k in flat_bv)
    # Write it both unrolled and scan-stacked, under big_vision's `params/` prefix.
    stacked = {k: v for k, v in flat_bv.items() if not k.startswith("Transformer/encoderblock_")}
    for k in [k for k in flat_bv if k.startswith("Transformer/encoderblock_0/")]:
        sub = k[len("Transformer/encoderblock_0/"):]
        stacked[f"Transformer/encoderblock/{sub}"] = np.stack(
            [flat_bv[f"Transformer/encoderblock_{i}/{sub}"] for i in range(cfg.depth)])
    images, ref = _golden(name)
    for variant, flat in (("unrolled", flat_bv), ("stacked", stacked)):
        path = tmp_path / f"{variant}.npz"
        save_npz(str(path), {f"params/{k}": v for k, v in flat.items()})
        cfg2, params2 = load_npz_params(str(path))
        assert cfg2 == cfg, variant
        np.testing.assert_allclose(predict(params2, cfg2, images), ref, atol=1e-4, err_msg=variant)


def test_mismatches_are_listed_in_one_error(tmp_path):
    raw = load_npz(str(GOLDEN / "tiny_token.npz"))
    raw.pop("Transformer/encoder_norm/bias")
    raw["Transformer/extra/kernel"] = np.zeros(3, np.float32)
    path = tmp_path / "broken.npz"
    save_npz(str(path), raw)
    with pytest.raises(CheckpointMismatchError) as err:
        load_npz_params(str(path))
    msg = str(err.value)
    assert "missing 1: Transformer/encoder_norm/bias" in msg and "unexpected 1: Transformer/extra/kernel" in msg
    # Against an explicit config of another size: every shape mismatch is named.
    with pytest.raises(CheckpointMismatchError, match="shape mismatch .*head/kernel"):
        load_npz_params(str(GOLDEN / "tiny_token.npz"), cfg=load_npz_params(
            str(GOLDEN / "tiny_token.npz"))[0].replace(num_classes=11))


def test_pickled_arrays_are_refused(tmp_path):
    path = tmp_path / "pickle.npz"
    np.savez(path, **{"embedding/kernel": np.array([object()], dtype=object)})
    with pytest.raises(ValueError, match="holds pickled Python objects"):
        load_npz(str(path))


def _random_params(cfg, seed=0):
    import jax

    params = FunctionalViT(cfg).init(jax.random.key(seed))
    # Perturb every leaf so zero-initialised ones (head, cls) are checked too.
    return jax.tree.map(lambda x: np.asarray(x) + np.random.default_rng(seed).normal(size=x.shape).astype(x.dtype),
                        params)


@pytest.mark.parametrize("kw", [dict(pool="token"), dict(pool="gap"), dict(pool="map"), dict(pool="token", gelu="erf")])
def test_timm_export_round_trip_is_bit_identical(kw, tmp_path):
    cfg = vit_config(width=64, depth=2, mlp_dim=128, num_heads=4, image_size=32, num_classes=5,
                     **{"patch_size": 8, **kw})
    params = _random_params(cfg)
    save_timm(str(tmp_path / "m.safetensors"), params, cfg)
    cfg2, params2 = load_timm(str(tmp_path / "m.safetensors"))
    assert cfg2 == cfg
    _assert_same_flat(params, params2)


def test_timm_layout_names_and_shapes():
    cfg = vit_config(width=64, depth=2, mlp_dim=128, num_heads=4, image_size=32, num_classes=5, patch_size=8)
    sd = to_timm(_random_params(cfg), cfg)
    assert sd["patch_embed.proj.weight"].shape == (64, 3, 8, 8)
    assert sd["blocks.1.attn.qkv.weight"].shape == (192, 64)
    assert sd["blocks.0.mlp.fc1.weight"].shape == (128, 64)
    assert sd["pos_embed"].shape == (1, 17, 64) and sd["cls_token"].shape == (1, 1, 64)
    assert sd["head.weight"].shape == (5, 64)
    rep = vit_config(width=64, depth=1, mlp_dim=128, num_heads=4, image_size=32, num_classes=5, patch_size=8,
                     rep_size=16)
    with pytest.raises(ValueError, match="pre-logits"):
        to_timm(_random_params(rep), rep)


def test_posemb_resize_known_values():
    d = 3
    grid = np.arange(4 * d, dtype=np.float32).reshape(1, 4, d)  # a 2x2 grid
    cls = np.full((1, 1, d), 7.0, np.float32)
    out = resize_posemb(np.concatenate([cls, grid], 1), (2, 2), (4, 4), num_prefix=1, method="bilinear")
    assert out.shape == (1, 17, d)
    np.testing.assert_array_equal(out[:, 0], cls[:, 0])  # class row kept apart
    g = out[0, 1:].reshape(4, 4, d)
    v = grid[0].reshape(2, 2, d)
    # Half-pixel centres: output rows sample source rows at -0.25, 0.25, 0.75, 1.25 (edges clamp).
    np.testing.assert_allclose(g[0, 0], v[0, 0], atol=1e-6)
    np.testing.assert_allclose(g[1, 1], 0.75 * (0.75 * v[0, 0] + 0.25 * v[0, 1])
                               + 0.25 * (0.75 * v[1, 0] + 0.25 * v[1, 1]), atol=1e-5)
    const = resize_posemb(np.ones((1, 12, d), np.float32), (3, 4), (6, 5), num_prefix=0)  # rectangular, bicubic
    assert const.shape == (1, 30, d)
    np.testing.assert_allclose(const, 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="method"):
        resize_posemb(grid, (2, 2), (4, 4), 0, method="nearest")


def test_finetune_surgery_from_golden_at_higher_resolution():
    import jax

    src_cfg, params = load_npz_params(str(GOLDEN / "tiny_gap_rep.npz"))
    target = src_cfg.replace(image_size=64, num_classes=3, rep_size=0)
    init = FunctionalViT(target).init(jax.random.key(0))
    new, notes = adapt_params(params, src_cfg, init, target)
    assert new["pos_embedding"].shape == (1, 64, 64)
    assert not np.any(new["head"]["kernel"]) and "pre_logits" not in new
    assert any("resized pos_embedding (4, 4) -> (8, 8)" in n for n in notes)
    assert any("dropped pre_logits/kernel" in n for n in notes)
    np.testing.assert_array_equal(new["encoder"]["blocks"]["mlp"]["fc1"]["kernel"],
                                  params["encoder"]["blocks"]["mlp"]["fc1"]["kernel"])
    logits = predict(new, target, np.zeros((2, 64, 64, 3), np.float32))
    assert logits.shape == (2, 3)
    wider = target.replace(width=128, num_heads=4, mlp_dim=256)
    with pytest.raises(CheckpointMismatchError, match="shape mismatch"):
        adapt_params(params, src_cfg, FunctionalViT(wider).init(jax.random.key(0)), wider)


def test_convert_command_round_trips_through_timm_and_big_vision(tmp_path):
    src = str(GOLDEN / "tiny_token.npz")
    assert cli.main(["convert", "--checkpoint", src, "--output", str(tmp_path / "m.safetensors"), "--to", "timm"]) == 0
    assert cli.main(["convert", "--checkpoint", str(tmp_path / "m.safetensors"), "--output", str(tmp_path / "bv.npz"),
                     "--to", "big_vision"]) == 0
    assert cli.main(["convert", "--checkpoint", str(tmp_path / "bv.npz"), "--output", str(tmp_path / "back.npz"),
                     "--to", "official"]) == 0
    images, ref = _golden("tiny_token")
    cfg, params = load_any(str(tmp_path / "back.npz"))
    np.testing.assert_allclose(predict(params, cfg, images), ref, atol=1e-4)
    assert cli.main(["convert", "--checkpoint", src, "--output", str(tmp_path / "ft.npz"), "--to", "official",
                     "--image-size", "48x64",
                     "--num-classes", "3"]) == 0
    cfg, params = load_any(str(tmp_path / "ft.npz"), image_size=(48, 64))
    assert cfg.grid == (6, 8) and cfg.num_classes == 3


def test_predict_on_an_image_folder(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(tmp_path / f"im{i}.png")
    out = tmp_path / "logits.npy"
    assert cli.main(["predict", "--checkpoint", str(GOLDEN / "tiny_token.npz"), "--images", str(tmp_path),
                     "--output", str(out), "--top-k", "2"]) == 0
    assert np.load(out).shape == (3, 10)
    printed = capsys.readouterr().out
    assert "ViT-w64d3m128h4/8" in printed and "im2.png:" in printed


_GROUPNORM_KEY = re.compile(r"(gn_root|block\d+/unit\d+/gn(\d|_proj))/(scale|bias)")


def test_hybrid_groupnorm_params_stored_4d_load_as_released(tmp_path):
    # The released R50+ViT-B_16 / AugReg R26, R50 files keep GroupNorm scale/bias as (1, 1, 1, C).
    raw = load_npz(str(GOLDEN / "tiny_hybrid.npz"))
    gn = [k for k in raw if _GROUPNORM_KEY.fullmatch(k)]
    assert {k.split("/")[-2] for k in gn} == {"gn_root", "gn1", "gn2", "gn3", "gn_proj"}
    save_npz(str(tmp_path / "4d.npz"), {k: v.reshape(1, 1, 1, -1) if k in gn else v for k, v in raw.items()})
    cfg, params = load_npz_params(str(tmp_path / "4d.npz"))
    images, ref = _golden("tiny_hybrid")
    np.testing.assert_allclose(predict(params, cfg, images), ref, atol=1e-4)
    save_npz_params(str(tmp_path / "back.npz"), params, cfg)  # written back as (C,), like the golden file
    back = load_npz(str(tmp_path / "back.npz"))
    for k in gn:
        np.testing.assert_array_equal(back[k], raw[k], err_msg=k)


@pytest.mark.parametrize("layout", ["opt/target", "big_vision train"])
def test_train_checkpoint_model_is_read_and_optimizer_state_ignored(layout, tmp_path, capsys):
    cfg, params = load_npz_params(str(GOLDEN / "tiny_token.npz"))
    flat = {k: np.asarray(v) for k, v in flatten(params).items()}
    if layout == "opt/target":  # flax.optim: the model under opt/target, moments under opt/state
        official = to_layout(flat, cfg, "official")
        model = {f"opt/target/{k}": v for k, v in official.items()}
        opt = {f"opt/state/param_states/{k}/grad_ema": np.zeros_like(v) for k, v in official.items()}
        opt["opt/state/step"] = np.array(7)
    else:  # big_vision: params/... next to opt/... (whose leaves repeat the parameter names)
        model = {f"params/{k}": v for k, v in to_layout(flat, cfg, "big_vision").items()}
        opt = {f"opt/1/0/mu/{k[len('params/'):]}": np.zeros_like(v) for k, v in model.items()}
        opt["opt/1/0/count"] = np.array(7)
    path = tmp_path / "train.npz"
    save_npz(str(path), {**model, **opt})
    cfg2, params2 = load_npz_params(str(path))
    assert cfg2 == cfg
    images, ref = _golden("tiny_token")
    np.testing.assert_allclose(predict(params2, cfg2, images), ref, atol=1e-4)
    prefix = "opt/target/" if layout == "opt/target" else "params/"
    assert f"read the model under '{prefix}'; ignored the {len(opt)} other entries (optimizer state)" in (
        capsys.readouterr().out)


def test_timm_kwargs_name_the_activation_and_hybrids_are_refused(tmp_path, capsys):
    import json

    from safetensors import safe_open
    from safetensors.numpy import save_file

    for gelu in ("tanh", "erf"):
        cfg = vit_config(width=64, depth=1, mlp_dim=128, num_heads=4, image_size=16, num_classes=3, patch_size=8,
                         gelu=gelu)
        save_timm(str(tmp_path / f"{gelu}.safetensors"), _random_params(cfg), cfg)
        with safe_open(str(tmp_path / f"{gelu}.safetensors"), "np") as f:
            kwargs = json.loads(f.metadata()["timm_kwargs"])
        # timm resolves act_layer with get_act_layer('gelu_tanh'); without it timm builds nn.GELU (erf).
        assert kwargs.get("act_layer") == ("gelu_tanh" if gelu == "tanh" else None), gelu
    # A state dict written by timm itself (no vit_jax metadata) computes timm's default, the exact GELU.
    save_file(to_timm(_random_params(cfg), cfg), str(tmp_path / "plain.safetensors"))
    assert load_timm(str(tmp_path / "plain.safetensors"))[0].gelu == "erf"

    hybrid = vit_config(width=64, depth=1, mlp_dim=128, num_heads=4, image_size=32, num_classes=3, patch_size=1,
                        resnet_layers=(1, 1))
    with pytest.raises(ValueError, match="timm export supports plain ViTs only"):
        to_timm(_random_params(hybrid), hybrid)
    dst = tmp_path / "hybrid.safetensors"
    assert cli.main(["convert", "--checkpoint", str(GOLDEN / "tiny_hybrid.npz"), "--output", str(dst), "--to",
                     "timm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "plain ViTs only" in err and len(err.splitlines()) == 1 and not dst.exists()


def test_convert_source_image_size_for_checkpoints_that_do_not_record_it(tmp_path, capsys):
    sincos = vit_config(width=64, depth=1, mlp_dim=128, num_heads=4, image_size=(16, 24), num_classes=3,
                        patch_size=8, posemb="sincos2d", pool="gap")
    rect = sincos.replace(posemb="learn", pool="token")  # a 2x3 learned grid: not square, so not inferable
    for name, cfg in (("sincos", sincos), ("rect", rect)):
        src, dst = tmp_path / f"{name}.npz", tmp_path / f"{name}_out.npz"
        params = _random_params(cfg)
        save_npz_params(str(src), params, cfg)
        assert cli.main(["convert", "--checkpoint", str(src), "--output", str(dst), "--to", "official"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "pass --source-image-size" in err, err
        assert cli.main(["convert", "--checkpoint", str(src), "--output", str(dst), "--to", "official",
                         "--source-image-size", "16x24"]) == 0
        cfg2, params2 = load_any(str(dst), image_size=(16, 24))
        assert cfg2 == cfg, name
        _assert_same_flat(params, params2)
    # A size that contradicts the one the checkpoint records is refused, not silently ignored.
    assert cli.main(["convert", "--checkpoint", str(GOLDEN / "tiny_token.npz"), "--output", str(tmp_path / "x.npz"),
                     "--to", "official",
                     "--source-image-size", "48"]) == 2
    assert "records image size 32x32" in capsys.readouterr().err


def test_root_only_hybrid_stem_round_trips_through_the_official_layout(tmp_path):
    """The official R+ViT-Ti checkpoints have conv_root/gn_root and no block{s}: the stride-4 root alone."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    cfg = vit_config(width=48, depth=1, mlp_dim=96, num_heads=3, patch_size=8, num_classes=5, image_size=64,
                     resnet_layers=(0,))
    assert cfg.grid == (2, 2) and cfg.name == "R+ViT-w48d1m96h3/32"
    with nnx.use_eager_sharding(False):
        model = FunctionalViT(cfg)
        params = model.init(jax.random.key(0))
    params = jax.tree.map(lambda x: x + 0.01 * jnp.arange(x.size, dtype=x.dtype).reshape(x.shape) / x.size, params)
    flat = flatten(params)
    assert {k for k in flat if k.startswith("stem/")} == {"stem/conv_root/kernel", "stem/gn_root/scale",
                                                         "stem/gn_root/bias"}
    save_npz_params(str(tmp_path / "r_ti.npz"), params, cfg)
    cfg2, params2 = load_npz_params(str(tmp_path / "r_ti.npz"))
    assert cfg2 == cfg
    images = np.random.default_rng(0).uniform(-1, 1, (2, 64, 64, 3)).astype(np.float32)
    _assert_same_flat(params, params2)
    np.testing.assert_allclose(np.asarray(model.apply(params, images)[0]), np.asarray(model.apply(params2, images)[0]),
                               atol=1e-6)
    with pytest.raises(ValueError, match=r"\(0,\) is the root-only stem"):
        vit_config(width=48, depth=1, mlp_dim=96, num_heads=3, resnet_layers=(2, 0))
