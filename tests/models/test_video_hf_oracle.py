"""transformers' ViViT (the unfactorised Model 1) as the oracle of the video family: a small VivitConfig with random
weights (no download) gives the same tokens and logits as our model from its weights (ANCHORS section 5(c))."""

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
