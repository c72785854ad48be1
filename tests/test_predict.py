"""`vit-jax predict`: a run checkpoint's recorded eval preprocessing on image files, --image-size, and unreadable
files (skipped and counted, or refused with --strict)."""

import io
import json

import jax
import numpy as np
import optax
from PIL import Image

from tests.conftest import GOLDEN
from vit_jax import cli
from vit_jax.checkpoints.npz import save_npz_params
from vit_jax.checkpoints.training import RunCheckpointer, model_meta
from vit_jax.data import pp as pp_lib
from vit_jax.models import vit_config
from vit_jax.models.vit import FunctionalViT
from vit_jax.eval.inference import predict
from vit_jax.train.step import init_state

# What the trainer records as pp_eval; the label op cannot apply to bare image files and must be left out.
PP_EVAL = "decode|resize_small(36)|central_crop(32)|value_range(-1,1)|onehot(5)"


def _params(cfg, seed=0):
    params = FunctionalViT(cfg).init(jax.random.key(seed))
    # Perturb every leaf so zero-initialised ones (head, cls) matter too.
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: np.asarray(x) + rng.normal(size=x.shape).astype(x.dtype), params)


def _image_folder(folder, sizes=((40, 50), (50, 40), (32, 32))):
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i, (h, w) in enumerate(sizes):
        image = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        image.save(folder / (f"im{i}.png" if i % 2 == 0 else f"im{i}.jpg"))
    return folder


def test_predict_on_a_folder_applies_the_runs_recorded_eval_preprocessing(tmp_path):
    cfg = vit_config(width=64, depth=2, mlp_dim=128, num_heads=4, image_size=32, patch_size=8, num_classes=5)
    params = _params(cfg)
    # A run workdir as the trainer writes it: the full train state (params + optimizer) and the run metadata.
    workdir = tmp_path / "run"
    ckpt = RunCheckpointer(str(workdir / "checkpoints"), async_save=False)
    state = init_state(jax.tree.map(jax.numpy.asarray, params), optax.adam(1e-3), jax.random.key_data(
        jax.random.key(0)))
    ckpt.save(3, state, {"step": 3}, {"model": model_meta(cfg), "pp_eval": PP_EVAL}, wait=True)
    ckpt.close()
    folder = _image_folder(tmp_path / "images")
    out = tmp_path / "logits.npy"
    assert cli.main(["predict", "--checkpoint", str(workdir), "--images", str(folder), "--output", str(out)]) == 0
    logits = np.load(out)
    assert logits.shape == (3, 5)
    fn = pp_lib.build(PP_EVAL.rsplit("|", 1)[0])
    images = []
    for name in sorted(p.name for p in folder.iterdir()):
        images.append(fn({"image": (folder / name).read_bytes()}, np.random.default_rng(0))["image"])
    np.testing.assert_allclose(logits, predict(params, cfg, np.stack(images)), rtol=0, atol=1e-6)


def test_predict_image_size_for_checkpoints_that_do_not_record_it(tmp_path, capsys):
    cfg = vit_config(width=64, depth=1, mlp_dim=128, num_heads=4, image_size=(16, 24), patch_size=8, num_classes=3,
                     posemb="sincos2d", pool="gap")
    params = _params(cfg)
    ckpt = tmp_path / "sincos.npz"
    save_npz_params(str(ckpt), params, cfg)
    folder = _image_folder(tmp_path / "images")
    out = tmp_path / "logits.npy"
    base = ["predict", "--checkpoint", str(ckpt), "--output", str(out)]
    assert cli.main([*base, "--images", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pass --image-size" in err, err
    assert cli.main([*base, "--images", str(folder), "--image-size", "16x24"]) == 0
    assert np.load(out).shape == (3, 3)
    # Arrays of images carry their own size: no flag needed.
    images = np.random.default_rng(2).uniform(-1, 1, (2, 16, 24, 3)).astype(np.float32)
    np.save(tmp_path / "images.npy", images)
    assert cli.main([*base, "--images", str(tmp_path / "images.npy")]) == 0
    np.testing.assert_allclose(np.load(out), predict(params, cfg, images), rtol=0, atol=1e-6)
    # The same array in a .npz under `images`; any other key is one line naming what the file holds.
    np.savez(tmp_path / "images.npz", images=images)
    assert cli.main([*base, "--images", str(tmp_path / "images.npz")]) == 0
    np.testing.assert_allclose(np.load(out), predict(params, cfg, images), rtol=0, atol=1e-6)
    capsys.readouterr()
    np.savez(tmp_path / "pictures.npz", pictures=images)
    assert cli.main([*base, "--images", str(tmp_path / "pictures.npz")]) == 2
    assert capsys.readouterr().err.strip().endswith("has no 'images' array (keys: pictures); save it as "
                                                    "np.savez(path, images=...)")
    # A size that contradicts the one the checkpoint records is an error, not silently ignored.
    assert cli.main(["predict", "--checkpoint", str(GOLDEN / "tiny_token.npz"), "--images", str(folder),
                     "--output", str(out), "--image-size", "48"]) == 2
    assert "records image size 32x32" in capsys.readouterr().err


def test_unreadable_files_in_a_folder_are_skipped_named_and_counted_or_refused_with_strict(tmp_path, capsys,
                                                                                         monkeypatch):
    cfg = vit_config(width=64, depth=1, mlp_dim=128, num_heads=4, image_size=32, patch_size=8, num_classes=3)
    ckpt = tmp_path / "model.npz"
    save_npz_params(str(ckpt), _params(cfg), cfg)
    folder = _image_folder(tmp_path / "images")
    (folder / "notes.jpg").write_text("this is a text file named .jpg")
    (folder / "empty.jpg").write_bytes(b"")
    Image.new("1", (13000, 13000)).save(folder / "bomb.png")  # a few KB on disk, 169M pixels decoded
    monkeypatch.setenv("VIT_JAX_MAX_IMAGE_PIXELS", "100000000")
    out = tmp_path / "logits.npy"
    base = ["predict", "--checkpoint", str(ckpt), "--images", str(folder), "--output", str(out)]
    assert cli.main(base) == 0
    captured = capsys.readouterr()
    assert np.load(out).shape == (3, 3) and "skipped 3 unreadable file(s)" in captured.out
    record = json.loads((tmp_path / "logits.npy.json").read_text())
    assert record["files"] == ["im0.png", "im1.jpg", "im2.png"]
    assert set(record["skipped"]) == {"notes.jpg", "empty.jpg", "bomb.png"}
    assert record["skipped"]["empty.jpg"] == "empty file (0 bytes)"
    assert "13000x13000 pixels is over the pixel budget" in record["skipped"]["bomb.png"]
    assert sorted(line.split(":")[0] for line in captured.err.splitlines()) == [
        "skipped bomb.png", "skipped empty.jpg", "skipped notes.jpg"]
    assert cli.main([*base, "--strict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vit-jax predict: error: {folder / 'bomb.png'}: "), err


def test_sixteen_bit_images_are_rescaled_not_clipped():
    from vit_jax.data.decode import decode_rgb

    ramp = (np.arange(1024, dtype=np.uint16) * 64).reshape(32, 32)  # 1,024 levels over the 16-bit range
    buf = io.BytesIO()
    Image.fromarray(ramp).save(buf, "PNG")
    pixels = decode_rgb(buf.getvalue())
    assert pixels.dtype == np.uint8 and pixels.shape == (32, 32, 3)
    np.testing.assert_array_equal(pixels[..., 0], np.rint(ramp / 257.0).astype(np.uint8))
    assert len(np.unique(pixels)) == 256  # 8 bits' worth of levels survive (clipping left 6)
