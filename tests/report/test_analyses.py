"""The analyses' numerics on hand-made inputs with known answers."""

import math

import numpy as np
import pytest

from vit_jax.report.analyses import (attention_rollout, embedding_pcs, mean_attention_distance, patch_distances,
                                     posemb_similarity, rollout_masks)


def with_class_token(patch_attn: np.ndarray, cls_share: float = 0.5) -> np.ndarray:
    """Embeds (..., N, N) patch attention in (..., 1+N, 1+N): every query also gives `cls_share` to the class
    token, and the class token's own row is uniform. Renormalising over patches must undo this."""
    *lead, n, _ = patch_attn.shape
    out = np.zeros((*lead, n + 1, n + 1), np.float32)
    out[..., 1:, 1:] = (1 - cls_share) * patch_attn
    out[..., 1:, 0] = cls_share
    out[..., 0, :] = 1.0 / (n + 1)
    return out


def layered(patch_attn: np.ndarray, depth: int = 2, batch: int = 3, heads: int = 2) -> np.ndarray:
    return np.broadcast_to(patch_attn, (depth, batch, heads, *patch_attn.shape)).astype(np.float32)


@pytest.mark.parametrize("has_cls", [False, True])
def test_attention_to_self_is_distance_zero(has_cls):
    a = layered(np.eye(6, dtype=np.float32))
    if has_cls:
        a = with_class_token(a)
    d = mean_attention_distance(a, (2, 3), (16, 16), has_class_token=has_cls)
    assert d.shape == (2, 2)
    np.testing.assert_allclose(d, 0.0, atol=1e-6)


@pytest.mark.parametrize("has_cls", [False, True])
def test_attention_to_horizontal_neighbour_is_one_patch_width(has_cls):
    gh, gw, ph, pw = 3, 4, 4, 6  # non-square patches: the width, not the height, must come out
    n = gh * gw
    a = np.zeros((n, n), np.float32)
    for r in range(gh):
        for c in range(gw):
            a[r * gw + c, r * gw + (c + 1 if c + 1 < gw else c - 1)] = 1.0  # right neighbour, left at the edge
    a = layered(a)
    if has_cls:
        a = with_class_token(a, cls_share=0.9)
    d = mean_attention_distance(a, (gh, gw), (ph, pw), has_class_token=has_cls)
    np.testing.assert_allclose(d, pw, rtol=1e-6)


def test_uniform_attention_matches_closed_form():
    # 2x2 grid of 16-pixel patches: from any patch the distances are 0, 16, 16 and 16*sqrt(2).
    d = mean_attention_distance(layered(np.full((4, 4), 0.25, np.float32)), (2, 2), (16, 16), False)
    np.testing.assert_allclose(d, (16 + 16 + 16 * math.sqrt(2)) / 4, rtol=1e-6)
    # 1x3 grid of 4x6-pixel patches: query means 6, 4, 6 -> 16/3.
    d = mean_attention_distance(with_class_token(layered(np.full((3, 3), 1 / 3, np.float32))), (1, 3), (4, 6), True)
    np.testing.assert_allclose(d, 16 / 3, rtol=1e-6)


def test_patch_distances_are_between_centres():
    d = patch_distances((2, 2), (8, 8))
    np.testing.assert_allclose(d[0], [0, 8, 8, 8 * math.sqrt(2)], rtol=1e-6)
    assert np.allclose(d, d.T)


def test_rollout_multiplies_residual_attention_through_layers():
    rng = np.random.default_rng(0)
    depth, batch, heads, t = 3, 2, 4, 5
    logits = rng.normal(size=(depth, batch, heads, t, t))
    a = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected = np.broadcast_to(np.eye(t), (batch, t, t))
    for layer in a:
        m = layer.mean(1) + np.eye(t)
        m = m / m.sum(-1, keepdims=True)
        expected = m @ expected
    got_cls = np.asarray(attention_rollout(a.astype(np.float32), has_class_token=True))
    np.testing.assert_allclose(got_cls, expected[:, 0, 1:], rtol=1e-5)
    got_gap = np.asarray(attention_rollout(a.astype(np.float32), has_class_token=False))
    np.testing.assert_allclose(got_gap, expected.mean(1), rtol=1e-5)
    assert got_gap.shape == (batch, t)


def test_rollout_of_one_layer_where_cls_attends_to_one_patch():
    n = 4
    a = np.zeros((1, 1, 2, n + 1, n + 1), np.float32)
    a[..., :, 3] = 1.0  # every query (class token included) looks only at patch index 2 (token 3)
    maps = np.asarray(attention_rollout(a, has_class_token=True))
    # (W + I) / 2 on the class row: 0.5 on itself, 0.5 on token 3.
    np.testing.assert_allclose(maps, [[0, 0, 0.5, 0]], atol=1e-7)
    masks = rollout_masks(maps, (2, 2), (8, 8))
    assert masks.shape == (1, 8, 8) and masks.max() == pytest.approx(1.0) and masks.min() >= 0


def test_posemb_similarity_drops_class_row_and_is_cosine():
    grid = (2, 3)
    onehot = np.eye(6, 8, dtype=np.float32) * np.arange(1, 7)[:, None]  # orthogonal rows of different norms
    posemb = np.concatenate([np.full((1, 8), 100.0, np.float32), onehot])[None]
    sim = posemb_similarity(posemb, grid, has_class_token=True)
    assert sim.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(sim.reshape(6, 6), np.eye(6), atol=1e-6)
    # gap models: no class row to drop
    np.testing.assert_allclose(posemb_similarity(onehot[None], grid, False).reshape(6, 6), np.eye(6), atol=1e-6)
    with pytest.raises(ValueError, match="expected 6"):
        posemb_similarity(posemb[:, :5], grid, True)


def test_embedding_pcs_finds_the_dominant_filter_direction():
    rng = np.random.default_rng(1)
    ph, pw, d = 4, 4, 50
    direction = rng.normal(size=ph * pw * 3)
    direction /= np.linalg.norm(direction)
    filters = np.outer(rng.normal(size=d) * 10, direction) + 0.01 * rng.normal(size=(d, ph * pw * 3))
    kernel = filters.T.reshape(ph, pw, 3, d)
    scaled, raw, ratio = embedding_pcs(kernel)
    assert scaled.shape == raw.shape == (28, ph, pw, 3) and ratio.shape == (28,)
    assert abs(float(raw[0].reshape(-1) @ direction)) > 0.999
    assert ratio[0] > 0.99 and np.all(np.diff(ratio) <= 1e-7)
    assert scaled.min() >= 0 and scaled.max() <= 1
    np.testing.assert_allclose(scaled.reshape(28, -1).min(1), 0, atol=1e-6)
    np.testing.assert_allclose(scaled.reshape(28, -1).max(1), 1, atol=1e-6)
    # fewer filters than 28: as many components as filters
    assert embedding_pcs(kernel[..., :5])[0].shape[0] == 5
    with pytest.raises(ValueError, match="plain ViT"):
        embedding_pcs(np.zeros((1, 1, 512, 64)))
