"""big_vision's SigLIP .npz layout (checkpoints/siglip_formats.py): both towers written under big_vision's names and
read back as the same architecture and arrays (tests/train/test_image_text_training.py converts a run and compares
its embeddings); its `params/` prefix and scanned text blocks; `load_any` reads the image tower; what the layout
cannot hold is refused on export."""

import dataclasses

import jax
import numpy as np
import pytest

from vit_jax.checkpoints import formats
from vit_jax.checkpoints.loading import load_any
from vit_jax.checkpoints.siglip_formats import (FAMILY, ImageTextSpec, export, load_siglip_npz, save_siglip_npz,
                                                to_siglip_layout)
from vit_jax.models.config import ModelConfigError, vit_config
from vit_jax.models.text import TextConfig

IMAGE = vit_config(None, num_classes=0, image_size=16, patch_size=4, width=32, depth=2, mlp_dim=64, num_heads=2,
                   pool="map", posemb="learn")
TEXT = TextConfig(vocab_size=50, max_len=8, width=32, depth=2, num_heads=2, mlp_dim=64)


def random_params(spec, seed=0):
    """Random values in every parameter (t and b too), so that a swapped or misplaced array shows."""
    rng = np.random.RandomState(seed)
    return jax.tree.map(lambda s: (0.3 * rng.standard_normal(s.shape)).astype(np.float32), spec.shapes())


@pytest.mark.parametrize("text_pool", ["last", "map"])
def test_two_towers_round_trip_through_big_visions_names(tmp_path, text_pool):
    spec = ImageTextSpec(IMAGE, dataclasses.replace(TEXT, pool=text_pool), 16)
    params = random_params(spec)
    path = str(tmp_path / "siglip.npz")
    save_siglip_npz(path, params, spec)
    names = set(np.load(path).files)
    assert {"t", "b", "img/embedding/kernel", "img/pos_embedding", "img/MAPHead_0/probe", "img/head/kernel",
            "img/Transformer/encoderblock_1/MlpBlock_0/Dense_0/kernel", "txt/Embed_0/embedding", "txt/pos_embedding",
            "txt/Encoder_0/encoderblock_1/MultiHeadDotProductAttention_0/query/kernel",
            "txt/Encoder_0/encoderblock_0/LayerNorm_1/scale", "txt/Encoder_0/encoder_norm/bias",
            "txt/head/kernel"} <= names
    assert ("txt/MAPHead_0/probe" in names) == (text_pool == "map")
    assert not any(n.startswith(("img_proj", "txt/block_", "txt/embedding")) for n in names)  # no name of ours
    loaded_spec, loaded = load_siglip_npz(path)
    assert loaded_spec == spec
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_params_prefix_and_scanned_text_blocks(tmp_path):
    """big_vision's own files: everything under `params/` (optimizer state beside it), and a scanned text encoder
    (`encoderblock/...` with a leading layer axis)."""
    spec = ImageTextSpec(IMAGE, TEXT, 16)
    params = random_params(spec, seed=3)
    flat = to_siglip_layout(params, spec)
    scanned = {k: v for k, v in flat.items() if not k.startswith("txt/Encoder_0/encoderblock_")}
    for k in [k for k in flat if k.startswith("txt/Encoder_0/encoderblock_0/")]:
        rest = k[len("txt/Encoder_0/encoderblock_0/"):]
        scanned[f"txt/Encoder_0/encoderblock/{rest}"] = np.stack(
            [flat[f"txt/Encoder_0/encoderblock_{i}/{rest}"] for i in range(TEXT.depth)])
    path = tmp_path / "bv.npz"
    np.savez(path, **{f"params/{k}": v for k, v in scanned.items()}, **{"opt/state/step": np.zeros(())})
    assert formats.reader_for(str(path)).family == FAMILY  # asked before the ViT reader, which would take img/
    loaded_spec, loaded = load_siglip_npz(str(path))
    assert loaded_spec == spec
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    cfg, img = load_any(str(path))  # the image tower alone: what LiT locks or a fine-tuning run starts from
    assert cfg == IMAGE
    jax.tree.map(np.testing.assert_array_equal, img, params["img"])


def test_export_refuses_what_the_layout_cannot_hold_and_notes_the_gelu(tmp_path):
    dst = str(tmp_path / "x.npz")
    clip_text = dataclasses.replace(TEXT, causal=True, pool="eos")
    clip = ImageTextSpec(IMAGE, clip_text, 16)
    with pytest.raises(formats.ExportError, match="causal / pooled at the end-of-text token"):
        export(clip, random_params(clip), dst, formats.ExportRequest(to="siglip"))
    spec = ImageTextSpec(IMAGE, TEXT, 16)
    with pytest.raises(formats.ExportError, match="writes the two towers as they are"):
        export(spec, random_params(spec), dst, formats.ExportRequest(to="siglip", num_classes=10))
    erf = ImageTextSpec(IMAGE.replace(gelu="erf"), TEXT, 16)
    _, notes, layout = export(erf, random_params(erf), dst, formats.ExportRequest(to="siglip"))
    assert layout == "big_vision SigLIP layout" and "image tower used the exact (erf) GELU" in notes[0]
    assert load_siglip_npz(dst)[0].image.gelu == "tanh"  # what big_vision computes


def test_an_image_tower_without_a_head_has_no_image_projection(tmp_path):
    """big_vision's image tower with no output dimension (out_dim=None, as open_clip's and HF's SigLIP: the MAP output
    is the embedding): no `img/head`. Read as a model without `img_proj` (image_proj=False), written back without a
    head, and embedding images as the normalised MAP output; a file whose sizes contradict that is refused."""
    from vit_jax.checkpoints.layouts import CheckpointMismatchError
    from vit_jax.models.text import l2_normalize

    spec = ImageTextSpec(IMAGE, TEXT, IMAGE.width, image_proj=False)
    params = random_params(spec, seed=5)
    assert "img_proj" not in params
    path = tmp_path / "headless.npz"
    save_siglip_npz(str(path), params, spec)
    assert not any(k.startswith("img/head") for k in np.load(path).files)
    loaded_spec, loaded = load_siglip_npz(str(path))
    assert loaded_spec == spec and "img_proj" not in loaded
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    images = np.random.RandomState(1).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
    model = spec.model().bind(loaded)
    np.testing.assert_allclose(model.embed_image(images), l2_normalize(model.image_features(images)), atol=1e-6)

    wider = ImageTextSpec(IMAGE, TEXT, 48)  # a text embedding of 48 beside 32 image features, and no img/head
    flat = to_siglip_layout(random_params(wider), wider)
    del flat["img/head/kernel"], flat["img/head/bias"]
    np.savez(tmp_path / "contradicts.npz", **flat)
    with pytest.raises(CheckpointMismatchError, match="32 wide and txt/head gives 48"):
        load_siglip_npz(str(tmp_path / "contradicts.npz"))


def test_without_an_image_projection_embed_dim_is_the_image_width():
    with pytest.raises(ModelConfigError, match="set embed_dim=32"):
        ImageTextSpec(IMAGE, TEXT, 16, image_proj=False).shapes()


def test_export_notes_that_open_clip_and_hugging_face_leave_out_the_image_projection(tmp_path):
    with_head = ImageTextSpec(IMAGE, TEXT, IMAGE.width)
    request = formats.ExportRequest(to="siglip")
    _, notes, _ = export(with_head, random_params(with_head), str(tmp_path / "a.npz"), request)
    assert any("read no img/head" in n for n in notes)
    headless = ImageTextSpec(IMAGE, TEXT, IMAGE.width, image_proj=False)
    _, notes, _ = export(headless, random_params(headless), str(tmp_path / "b.npz"), request)
    assert notes == []
