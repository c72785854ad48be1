"""BiT ResNet-v2 checkpoints: timm `resnetv2_*_bit` state dicts and big_transfer `.npz` files, written here with their
exact key names and shapes -> load_any -> `vit-jax predict` -> export back the same keys and arrays."""

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vit_jax import cli
from vit_jax.checkpoints.bit import save_bit_npz, save_bit_timm
from vit_jax.checkpoints.layouts import CheckpointMismatchError, flatten
from vit_jax.checkpoints.loading import load_any
from vit_jax.checkpoints.surgery import adapt_params
from vit_jax.models import vit_config
from vit_jax.models.bit_config import BiTConfig
from vit_jax.models.build import build_model

LAYERS, CLASSES = (1, 2), 5  # two stages: the first unit of each has a projection, the second of stage 2 does not


def timm_and_bit_dicts(seed=0):
    """The same random weights as timm's state dict (PyTorch layouts) and as a big_transfer .npz (TF layouts)."""
    rng = np.random.default_rng(seed)
    timm, bit = {}, {}

    def conv(timm_key, bit_key, cout, cin, k):
        w = rng.normal(0, 0.2, (cout, cin, k, k)).astype(np.float32)
        timm[timm_key], bit[bit_key] = w, w.transpose(2, 3, 1, 0)

    def norm(timm_key, bit_key, c):
        g, b = rng.normal(1, 0.2, c).astype(np.float32), rng.normal(0, 0.2, c).astype(np.float32)
        timm[f"{timm_key}.weight"], timm[f"{timm_key}.bias"] = g, b
        bit[f"{bit_key}/gamma"], bit[f"{bit_key}/beta"] = g, b

    conv("stem.conv.weight", "resnet/root_block/standardized_conv2d/kernel", 64, 3, 7)
    cin = 64
    for s, units in enumerate(LAYERS):
        mid = 64 * 2**s
        for u in range(units):
            t, b = f"stages.{s}.blocks.{u}", f"resnet/block{s + 1}/unit{u + 1:02d}"
            norm(f"{t}.norm1", f"{b}/a/group_norm", cin)
            if u == 0:
                conv(f"{t}.downsample.conv.weight", f"{b}/a/proj/standardized_conv2d/kernel", 4 * mid, cin, 1)
            conv(f"{t}.conv1.weight", f"{b}/a/standardized_conv2d/kernel", mid, cin, 1)
            norm(f"{t}.norm2", f"{b}/b/group_norm", mid)
            conv(f"{t}.conv2.weight", f"{b}/b/standardized_conv2d/kernel", mid, mid, 3)
            norm(f"{t}.norm3", f"{b}/c/group_norm", mid)
            conv(f"{t}.conv3.weight", f"{b}/c/standardized_conv2d/kernel", 4 * mid, mid, 1)
            cin = 4 * mid
    norm("norm", "resnet/group_norm", cin)
    conv("head.fc.weight", "resnet/head/conv2d/kernel", CLASSES, cin, 1)
    timm["head.fc.bias"] = bit["resnet/head/conv2d/bias"] = rng.normal(0, 0.2, CLASSES).astype(np.float32)
    return timm, bit


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bit")
    timm, bit = timm_and_bit_dicts()
    save_file(timm, str(d / "bit.safetensors"))  # as timm's own files: no metadata of ours
    np.savez(d / "bit.npz", **bit)
    images = np.random.default_rng(1).uniform(-1, 1, (3, 40, 40, 3)).astype(np.float32)
    np.savez(d / "batch.npz", images=images)
    return d, timm, bit


def test_architecture_and_numerics_are_inferred_from_the_keys(files):
    d, _, _ = files
    cfg_t, params_t = load_any(str(d / "bit.safetensors"))
    cfg_n, params_n = load_any(str(d / "bit.npz"))
    for cfg in (cfg_t, cfg_n):
        assert isinstance(cfg, BiTConfig) and cfg.layers == LAYERS and cfg.width_factor == 1
        assert cfg.num_classes == CLASSES
    assert (cfg_t.gn_eps, cfg_t.ws_eps) == (1e-5, 1e-8)  # timm's resnetv2_*_bit
    assert (cfg_n.gn_eps, cfg_n.ws_eps) == (1e-6, 1e-10)  # big_transfer's
    ft, fn = flatten(params_t), flatten(params_n)
    assert sorted(ft) == sorted(fn) and all(np.array_equal(ft[k], fn[k]) for k in ft)


def test_predict_command_on_both_layouts(files, tmp_path):
    d, _, _ = files
    logits = {}
    for name in ("bit.safetensors", "bit.npz"):
        out = tmp_path / f"{name}.npy"
        assert cli.main(["predict", "--checkpoint", str(d / name), "--images", str(d / "batch.npz"),
                         "--output", str(out)]) == 0
        logits[name] = np.load(out)
        assert logits[name].shape == (3, CLASSES) and np.isfinite(logits[name]).all()
    # The same weights; only the epsilons of the two sources differ.
    np.testing.assert_allclose(logits["bit.safetensors"], logits["bit.npz"], rtol=1e-3, atol=1e-3)
    assert np.abs(logits["bit.npz"]).max() > 0.1


def test_analyze_refuses_a_resnet_in_one_line(files, tmp_path, capsys):
    d, _, _ = files
    assert cli.main(["analyze", "--checkpoint", str(d / "bit.npz"), "--what", "posemb-similarity",
                     "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "BiT-R" in err and "analyses are of Vision Transformers" in err, err


def test_export_gives_back_the_same_keys_and_arrays(files, tmp_path):
    d, timm, bit = files
    cfg, params = load_any(str(d / "bit.safetensors"))
    save_bit_timm(str(tmp_path / "again.safetensors"), params, cfg)
    again = load_file(str(tmp_path / "again.safetensors"))
    assert sorted(again) == sorted(timm) and all(np.array_equal(again[k], timm[k]) for k in timm)
    assert load_any(str(tmp_path / "again.safetensors"))[0] == cfg  # our metadata keeps timm's epsilons and size
    save_bit_npz(str(tmp_path / "again.npz"), params, cfg)
    with np.load(tmp_path / "again.npz") as z:
        assert sorted(z.files) == sorted(bit) and all(np.array_equal(z[k], bit[k]) for k in bit)


def test_convert_command_between_layouts_with_a_new_head(files, tmp_path):
    d, _, bit = files
    out = tmp_path / "converted.npz"
    assert cli.main(["convert", "--checkpoint", str(d / "bit.safetensors"), "--output", str(out), "--to", "official",
                     "--num-classes", "3"]) == 0
    with np.load(out) as z:
        assert sorted(z.files) == sorted(bit)
        assert z["resnet/head/conv2d/kernel"].shape == (1, 1, 512, 3) and not z["resnet/head/conv2d/kernel"].any()
        np.testing.assert_array_equal(z["resnet/block2/unit02/b/standardized_conv2d/kernel"],
                                      bit["resnet/block2/unit02/b/standardized_conv2d/kernel"])
    assert cli.main(["convert", "--checkpoint", str(out), "--output", str(tmp_path / "x.npz"), "--to",
                     "big_vision"]) == 2


def test_a_missing_key_is_a_one_line_error(files, tmp_path):
    _, timm, _ = files
    broken = {k: v for k, v in timm.items() if k != "stages.1.blocks.1.conv2.weight"}
    save_file(broken, str(tmp_path / "broken.safetensors"))
    with pytest.raises(CheckpointMismatchError, match=r"missing \['stages.1.blocks.1.conv2.weight'\]") as e:
        load_any(str(tmp_path / "broken.safetensors"))
    assert "\n" not in str(e.value)


def test_finetuning_surgery_puts_a_new_zero_head_on_a_bit(files):
    d, _, _ = files
    src_cfg, src = load_any(str(d / "bit.npz"))
    target_cfg = src_cfg.replace(num_classes=3)
    # The fresh init only provides the shapes here (and the head's zeros); every other array comes from the file.
    fresh = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), build_model(target_cfg).shapes)
    params, notes = adapt_params(src, src_cfg, fresh, target_cfg)
    assert sorted(notes) == ["re-initialised head/bias (5,) -> (3,)", "re-initialised head/kernel (512, 5) -> (512, 3)"]
    assert not params["head"]["kernel"].any()
    kept = flatten(src)
    assert all(np.array_equal(v, kept[k]) for k, v in flatten(params).items() if not k.startswith("head/"))
    with pytest.raises(CheckpointMismatchError, match="another model family"):
        adapt_params(src, src_cfg, {}, vit_config("Ti/16"))
