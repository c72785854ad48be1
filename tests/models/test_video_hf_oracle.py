"""transformers' ViViT (the unfactorised Model 1) as the oracle of the video family: a small VivitConfig with random
weights (no download) gives the same tokens and logits as our model from its weights (ANCHORS section 5(c))."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from tests.interop import require_transformers
from vit_jax.checkpoints.loading import load_any
from vit_jax.checkpoints.video_formats import from_vivit, video_config_from_hf
from vit_jax.models.build import build_model

SMALL = dict(image_size=32, num_frames=4, tubelet_size=[2, 8, 8], hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=128)


def _randomise(torch, model) -> None:
    """Every weight random (their init leaves position embeddings and the class token at zero)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.1
            p.copy_(1.0 + noise if "layernorm" in name and name.endswith("weight") else noise)


@pytest.fixture(scope="module")
def clips():
    return np.random.default_rng(0).uniform(-1, 1, (2, 4, 32, 32, 3)).astype(np.float32)


def test_vivit_model_tokens_match_ours(clips):
    transformers = require_transformers()
    import torch

    hf = transformers.VivitModel(transformers.VivitConfig(**SMALL)).eval()
    _randomise(torch, hf)
    cfg = video_config_from_hf(hf.config.to_dict())
    assert (cfg.gelu, cfg.grid, cfg.ln_eps) == ("tanh", (2, 4, 4), 1e-6)  # gelu_fast is the tanh approximation
    params = from_vivit({k: v.numpy() for k, v in hf.state_dict().items()}, cfg)
    with torch.no_grad():  # transformers takes (B, T, C, H, W)
        expect = hf(pixel_values=torch.from_numpy(clips).permute(0, 1, 4, 2, 3)).last_hidden_state.numpy()
    _, out = build_model(cfg).apply(params, jnp.asarray(clips))
    np.testing.assert_allclose(np.asarray(out["encoded"]), expect, atol=1e-4)


def test_a_saved_vivit_classifier_loads_and_predicts_as_transformers(clips, tmp_path):
    transformers = require_transformers()
    import torch

    hf = transformers.VivitForVideoClassification(transformers.VivitConfig(**SMALL, num_labels=5)).eval()
    _randomise(torch, hf)
    hf.save_pretrained(tmp_path)  # model.safetensors + config.json
    cfg, params = load_any(str(tmp_path / "model.safetensors"))  # recognised as a ViViT, config.json read
    assert (cfg.num_classes, cfg.num_heads, cfg.num_frames) == (5, 4, 4)
    with torch.no_grad():
        expect = hf(pixel_values=torch.from_numpy(clips).permute(0, 1, 4, 2, 3)).logits.numpy()
    logits, _ = build_model(cfg).apply(params, jnp.asarray(clips))
    np.testing.assert_allclose(np.asarray(logits), expect, atol=1e-4)


def test_vit_jax_predict_runs_the_vivit_file_on_a_clip_array_and_a_folder_of_clip_files(tmp_path, capsys):
    """`vit-jax predict` on a video checkpoint: clips (N, T, H, W, 3), one clip (T, H, W, 3), and a folder of clip
    files (frames stacked vertically, moving_digits' layout; a file of the wrong height is skipped and counted) give
    transformers' logits; views of clips (N, V, T, H, W, 3) the mean of their views' logits, and a folder read with
    a multi-view preprocessing its views."""
    transformers = require_transformers()
    import torch

    from vit_jax.commands import predict
    from vit_jax.data import digits

    hf = transformers.VivitForVideoClassification(transformers.VivitConfig(**SMALL, num_labels=5)).eval()
    _randomise(torch, hf)
    hf.save_pretrained(tmp_path / "vivit")
    ckpt = str(tmp_path / "vivit" / "model.safetensors")
    # grey uint8 frames, as a clip file holds them, in [-1, 1] as the default preprocessing maps them
    frames = np.random.default_rng(1).integers(0, 256, (2, 4, 32, 32), dtype=np.uint8)
    clips = np.repeat((frames / 127.5 - 1.0)[..., None], 3, -1).astype(np.float32)
    with torch.no_grad():
        expect = hf(pixel_values=torch.from_numpy(clips).permute(0, 1, 4, 2, 3)).logits.numpy()

    np.save(tmp_path / "clips.npy", clips)
    np.save(tmp_path / "one.npy", clips[1])
    out = str(tmp_path / "logits.npy")
    assert predict.main(["--checkpoint", ckpt, "--images", str(tmp_path / "clips.npy"), "--output", out]) == 0
    np.testing.assert_allclose(np.load(out), expect, atol=1e-4)
    assert predict.main(["--checkpoint", ckpt, "--images", str(tmp_path / "one.npy"), "--output", out]) == 0
    np.testing.assert_allclose(np.load(out), expect[1:], atol=1e-4)

    folder = tmp_path / "clips"
    folder.mkdir()
    for i, clip in enumerate(frames):
        (folder / f"clip{i}.png").write_bytes(digits.png_bytes(clip.reshape(4 * 32, 32)))
    (folder / "short.png").write_bytes(digits.png_bytes(frames[0, :3].reshape(3 * 32, 32)))  # 96 rows: 4 x 24
    (folder / "odd.png").write_bytes(digits.png_bytes(np.zeros((99, 32), np.uint8)))  # not 4 frames of any height
    capsys.readouterr()
    assert predict.main(["--checkpoint", ckpt, "--images", str(folder), "--output", out]) == 0
    np.testing.assert_allclose(np.load(out), expect, atol=1e-4)
    err = capsys.readouterr().err
    assert "skipped odd.png: decode_clip(4): the stored image has 99 rows" in err
    assert "skipped short.png: preprocessed to shape (4, 24, 32, 3), the model takes (4, 32, 32, 3)" in err
    assert json.loads((tmp_path / "logits.npy.json").read_text())["files"] == ["clip0.png", "clip1.png"]

    # views of each clip (N, V, T, H, W, 3), as a multi-view eval preprocessing makes them: the views' mean logits
    backwards = np.ascontiguousarray(clips[:, ::-1])
    with torch.no_grad():
        expect_backwards = hf(pixel_values=torch.from_numpy(backwards).permute(0, 1, 4, 2, 3)).logits.numpy()
    np.save(tmp_path / "views.npy", np.stack([clips, backwards], axis=1))
    assert predict.main(["--checkpoint", ckpt, "--images", str(tmp_path / "views.npy"), "--output", out]) == 0
    np.testing.assert_allclose(np.load(out), (expect + expect_backwards) / 2, atol=1e-4)
    from vit_jax.data.image_files import read_image_folder
    read = read_image_folder(str(folder), "decode_clip(4)|sample_clip(4, random=False, views=2)|value_range(-1,1)",
                             shape=(4, 32, 32, 3))
    assert read.images.shape == (2, 2, 4, 32, 32, 3) and sorted(read.skipped) == ["odd.png", "short.png"]
    np.testing.assert_allclose(read.images[:, 1], clips, atol=1e-6)

    wrong = np.zeros((2, 2, 32, 32, 3), np.float32)  # 2 frames for a 4-frame model: one line, no traceback
    np.save(tmp_path / "wrong.npy", wrong)
    assert predict.main(["--checkpoint", ckpt, "--images", str(tmp_path / "wrong.npy"), "--output", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "(4, 32, 32, 3), got (2, 2, 32, 32, 3)" in err
