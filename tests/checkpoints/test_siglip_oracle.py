"""The SigLIP .npz we write, read by another implementation: transformers' `SiglipModel` (random small config, no
download; tanh GELU and LayerNorm eps 1e-6 as big_vision) loaded from the file's big_vision names gives our image and
text embeddings. The mapping below is big_vision -> Hugging Face names, written here for the test from the two
layouts' documented shapes."""

import jax
import numpy as np

from tests.interop import require_transformers
from vit_jax.checkpoints.siglip_formats import ImageTextSpec, load_siglip_npz, save_siglip_npz
from vit_jax.models.config import vit_config
from vit_jax.models.text import TextConfig

IMAGE = vit_config(None, num_classes=0, image_size=16, patch_size=4, width=32, depth=2, mlp_dim=64, num_heads=2,
                   pool="map", posemb="learn")
TEXT = TextConfig(vocab_size=50, max_len=8, width=32, depth=2, num_heads=2, mlp_dim=64)


def _block(flat, src, dst):
    """One encoder block: big_vision's (D, H, Dh) attention kernels -> torch Linear (out, in) weights."""
    out = {}
    for i in (0, 1):
        out[f"{dst}layer_norm{i + 1}.weight"] = flat[f"{src}LayerNorm_{i}/scale"]
        out[f"{dst}layer_norm{i + 1}.bias"] = flat[f"{src}LayerNorm_{i}/bias"]
    attn = f"{src}MultiHeadDotProductAttention_0/"
    for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        kernel = flat[f"{attn}{ours}/kernel"]
        out[f"{dst}self_attn.{theirs}.weight"] = kernel.reshape(kernel.shape[0], -1).T
        out[f"{dst}self_attn.{theirs}.bias"] = flat[f"{attn}{ours}/bias"].reshape(-1)
    kernel = flat[f"{attn}out/kernel"]
    out[f"{dst}self_attn.out_proj.weight"] = kernel.reshape(-1, kernel.shape[-1]).T
    out[f"{dst}self_attn.out_proj.bias"] = flat[f"{attn}out/bias"]
    for i, fc in ((0, "fc1"), (1, "fc2")):
        out[f"{dst}mlp.{fc}.weight"] = flat[f"{src}MlpBlock_0/Dense_{i}/kernel"].T
        out[f"{dst}mlp.{fc}.bias"] = flat[f"{src}MlpBlock_0/Dense_{i}/bias"]
    return out


def hf_state_dict(flat):
    sd = {"logit_scale": flat["t"], "logit_bias": flat["b"],
          "vision_model.embeddings.patch_embedding.weight": flat["img/embedding/kernel"].transpose(3, 2, 0, 1),
          "vision_model.embeddings.patch_embedding.bias": flat["img/embedding/bias"],
          "vision_model.embeddings.position_embedding.weight": flat["img/pos_embedding"][0],
          "vision_model.post_layernorm.weight": flat["img/Transformer/encoder_norm/scale"],
          "vision_model.post_layernorm.bias": flat["img/Transformer/encoder_norm/bias"],
          "text_model.embeddings.token_embedding.weight": flat["txt/Embed_0/embedding"],
          "text_model.embeddings.position_embedding.weight": flat["txt/pos_embedding"][0],
          "text_model.final_layer_norm.weight": flat["txt/Encoder_0/encoder_norm/scale"],
          "text_model.final_layer_norm.bias": flat["txt/Encoder_0/encoder_norm/bias"],
          "text_model.head.weight": flat["txt/head/kernel"].T, "text_model.head.bias": flat["txt/head/bias"]}
    for i in range(IMAGE.depth):
        sd.update(_block(flat, f"img/Transformer/encoderblock_{i}/", f"vision_model.encoder.layers.{i}."))
    for i in range(TEXT.depth):
        sd.update(_block(flat, f"txt/Encoder_0/encoderblock_{i}/", f"text_model.encoder.layers.{i}."))
    head, attn = "img/MAPHead_0/", "img/MAPHead_0/MultiHeadDotProductAttention_0/"
    qkv = ("query", "key", "value")
    sd.update({
        "vision_model.head.probe": flat[f"{head}probe"],
        "vision_model.head.attention.in_proj_weight": np.concatenate(
            [flat[f"{attn}{p}/kernel"].reshape(IMAGE.width, -1).T for p in qkv]),
        "vision_model.head.attention.in_proj_bias": np.concatenate([flat[f"{attn}{p}/bias"].reshape(-1) for p in qkv]),
        "vision_model.head.attention.out_proj.weight": flat[f"{attn}out/kernel"].reshape(-1, IMAGE.width).T,
        "vision_model.head.attention.out_proj.bias": flat[f"{attn}out/bias"],
        "vision_model.head.layernorm.weight": flat[f"{head}LayerNorm_0/scale"],
        "vision_model.head.layernorm.bias": flat[f"{head}LayerNorm_0/bias"]})
    for i, fc in ((0, "fc1"), (1, "fc2")):
        sd[f"vision_model.head.mlp.{fc}.weight"] = flat[f"{head}MlpBlock_0/Dense_{i}/kernel"].T
        sd[f"vision_model.head.mlp.{fc}.bias"] = flat[f"{head}MlpBlock_0/Dense_{i}/bias"]
    return sd


def test_transformers_siglip_reads_our_npz_to_the_same_embeddings(tmp_path):
    transformers = require_transformers()
    import torch

    # Hugging Face's SigLIP has no image projection (big_vision's out_dim=None): neither has ours here.
    spec = ImageTextSpec(IMAGE, TEXT, IMAGE.width, image_proj=False)
    rng = np.random.RandomState(0)
    params = jax.tree.map(lambda s: (0.3 * rng.standard_normal(s.shape)).astype(np.float32), spec.shapes())
    path = tmp_path / "siglip.npz"
    save_siglip_npz(str(path), params, spec)
    flat = dict(np.load(path))

    config = transformers.SiglipConfig(
        text_config=dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=8, bos_token_id=None, eos_token_id=None,
                         pad_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=16, patch_size=4))
    model = transformers.SiglipModel(config).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                                                 for k, v in hf_state_dict(flat).items()}, strict=False)
    assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)

    images = rng.uniform(-1, 1, (3, 16, 16, 3)).astype(np.float32)
    ids = rng.randint(0, 50, (3, 8))
    with torch.no_grad():
        theirs_img = model.vision_model(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2))).pooler_output
        theirs_txt = model.text_model(input_ids=torch.from_numpy(ids)).pooler_output
    normalize = lambda x: x.numpy() / np.linalg.norm(x.numpy(), axis=-1, keepdims=True)  # noqa: E731

    loaded_spec, loaded = load_siglip_npz(str(path))
    ours = jax.jit(lambda p: (loaded_spec.model().bind(p).embed_image(images),
                              loaded_spec.model().bind(p).embed_text(ids)))(loaded)
    np.testing.assert_allclose(np.asarray(ours[0]), normalize(theirs_img), atol=1e-5)
    np.testing.assert_allclose(np.asarray(ours[1]), normalize(theirs_txt), atol=1e-5)
