"""`vit-jax analyze` on the golden official-layout checkpoints: every figure and its numbers, with their shapes."""

import json

import numpy as np
import pytest
from PIL import Image

from vit_jax.commands import analyze as analyze_command
from vit_jax.report.analysis_inputs import load_images, to_model_range

PNG = b"\x89PNG\r\n\x1a\n"


def analyze(golden_dir, case, out, what="all", extra=()):
    return analyze_command.main(["--checkpoint", str(golden_dir / f"{case}.npz"), "--what", what, "--output", str(out),
                             "--images", str(golden_dir / f"{case}.io.npz"), "--batch-size", "3", *extra])


def arrays(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def check_png(path):
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 1000


@pytest.mark.parametrize("case,has_cls", [("tiny_token", True), ("tiny_gap_rep", False)])
def test_all_analyses_on_plain_vit(golden_dir, tmp_path, case, has_cls):
    # 3 blocks, 4 heads, 8x8 patches on 32x32 images: a 4x4 grid; 4 images (batch 3: the last batch is padded).
    assert analyze(golden_dir, case, tmp_path) == 0
    for stem in ("attention_distance", "posemb_similarity", "embedding_pcs", "attention_rollout"):
        check_png(tmp_path / f"{stem}.png")
        assert json.loads((tmp_path / f"{stem}.json").read_text())["class_token"] is has_cls

    dist = arrays(tmp_path / "attention_distance.npz")
    assert dist["distance"].shape == (3, 4) and dist["per_image"].shape == (3, 4, 4)
    # attention spreads over a 32-pixel image: every mean distance lies between 0 and the diagonal
    assert np.all(dist["distance"] > 0) and np.all(dist["distance"] < 24 * np.sqrt(2))
    np.testing.assert_allclose(dist["distance"], dist["per_image"].mean(1), rtol=1e-6)
    meta = json.loads((tmp_path / "attention_distance.json").read_text())
    assert meta["num_images"] == 4 and meta["patch_pixels"] == [8, 8] and len(meta["distance"]) == 3

    sim = arrays(tmp_path / "posemb_similarity.npz")["similarity"]
    assert sim.shape == (4, 4, 4, 4)
    np.testing.assert_allclose([sim[i, j, i, j] for i in range(4) for j in range(4)], 1.0, rtol=1e-5)

    pcs = arrays(tmp_path / "embedding_pcs.npz")
    assert pcs["components"].shape == (28, 8, 8, 3) and pcs["explained_variance_ratio"].shape == (28,)

    roll = arrays(tmp_path / "attention_rollout.npz")
    assert roll["maps"].shape == (4, 4, 4) and roll["masks"].shape == (4, 32, 32)
    assert np.all(roll["maps"] > 0)


def test_hybrid_analyses_and_clear_error_for_embedding_pcs(golden_dir, tmp_path, capsys):
    # ResNet stem downsamples by 8; the Transformer sees 1x1 patches of a 4x4 feature map (8-pixel patches).
    assert analyze(golden_dir, "tiny_hybrid", tmp_path, "attention-distance,posemb-similarity,attention-rollout") == 0
    assert arrays(tmp_path / "attention_distance.npz")["distance"].shape == (2, 4)
    assert json.loads((tmp_path / "attention_distance.json").read_text())["patch_pixels"] == [8, 8]
    assert arrays(tmp_path / "posemb_similarity.npz")["similarity"].shape == (4, 4, 4, 4)
    assert arrays(tmp_path / "attention_rollout.npz")["masks"].shape == (4, 32, 32)
    assert analyze(golden_dir, "tiny_hybrid", tmp_path / "pcs", "embedding-pcs") == 2
    assert "plain ViT" in capsys.readouterr().err


def test_user_errors_are_one_line_with_the_fix(golden_dir, tmp_path, capsys):
    ckpt = str(golden_dir / "tiny_token.npz")
    assert analyze_command.main(["--checkpoint", ckpt, "--what", "attention-rollout", "--output", str(tmp_path)]) == 2
    assert "--images" in capsys.readouterr().err
    assert analyze_command.main(["--checkpoint", ckpt, "--what", "attn", "--output", str(tmp_path)]) == 2
    assert "choose from" in capsys.readouterr().err
    assert analyze_command.main(["--checkpoint", str(tmp_path / "none.npz"), "--what", "embedding-pcs",
                             "--output", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_images_from_folder_array_and_dataset(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(np.full((20, 30, 3), 60 * i, np.uint8)).save(folder / f"{i}.png")
    (folder / "notes.txt").write_text("not an image")
    x = load_images(images=str(folder), dataset=None, split="test", image_size=(32, 32), max_images=2)
    assert x.shape == (2, 32, 32, 3) and x.dtype == np.float32
    np.testing.assert_allclose(x[1], 60 / 127.5 - 1, atol=1e-5)

    np.save(tmp_path / "gray.npy", np.full((5, 16, 16), 255, np.uint8))
    x = load_images(images=str(tmp_path / "gray.npy"), dataset=None, split="", image_size=(32, 32), max_images=4)
    assert x.shape == (4, 32, 32, 3) and np.allclose(x, 1.0)
    with pytest.raises(ValueError, match="must be in \\[-1, 1\\]"):
        to_model_range(np.full((1, 4, 4, 3), 200.0, np.float32), (4, 4))
    np.savez(tmp_path / "wrong.npz", x=np.zeros((1, 4, 4, 3)))
    with pytest.raises(ValueError, match="no 'images' array"):
        load_images(images=str(tmp_path / "wrong.npz"), dataset=None, split="", image_size=(4, 4), max_images=1)

    x = load_images(images=None, dataset="digits", split="test", image_size=(32, 32), max_images=5,
                    data_dir=str(tmp_path / "tfds"))
    assert x.shape == (5, 32, 32, 3) and x.min() >= -1 and x.max() <= 1 and x.std() > 0.1
