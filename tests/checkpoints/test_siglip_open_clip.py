"""The SigLIP .npz we write, read by open_clip's own big_vision loader (`open_clip.convert.load_big_vision_weights`,
what `open_clip.load_checkpoint` calls for a .npz): a small open_clip SigLIP model (random weights, no download) built
the way open_clip's SigLIP configs build theirs (a timm ViT with a MAP head and no projection as the image tower, a
bidirectional text Transformer pooled at the last token with a biased projection, LayerNorm eps 1e-6) gives our
image and text embeddings, temperature and bias.

open_clip's SigLIP configs leave the text tower's GELU at the exact (erf) form while big_vision (and the file read
here) computes the tanh form; the test builds open_clip's text tower with the tanh form (its `act_kwargs`) so that the
comparison is exact. Its loader reads no `img/head`: the image embedding is the MAP head's output, so the towers here
have no image projection (image_proj=False, big_vision's `out_dim=None`: what a run with `siglip.image_proj=False`
writes).
"""

import jax
import numpy as np
import pytest

from tests.interop import require_open_clip
from vit_jax.checkpoints.siglip_formats import ImageTextSpec, load_siglip_npz, save_siglip_npz
from vit_jax.models.config import vit_config
from vit_jax.models.text import TextConfig

IMAGE = vit_config(None, num_classes=0, image_size=16, patch_size=4, width=32, depth=2, mlp_dim=64, num_heads=2,
                   pool="map", posemb="learn")
TEXT = TextConfig(vocab_size=50, max_len=8, width=32, depth=2, num_heads=2, mlp_dim=64)
TIMM_NAME = "vit_jax_test_siglip_tiny"  # the image tower, registered with timm for open_clip to create by name


def register_tiny_timm_vit(timm):
    """A timm ViT shaped as IMAGE (no class token, MAP pooling, tanh GELU), under TIMM_NAME: open_clip builds its
    image tower with timm.create_model(name, num_classes=0, global_pool='map')."""
    from timm.models import register_model
    from timm.models.vision_transformer import VisionTransformer

    if timm.models.is_model(TIMM_NAME):
        return

    def vit_jax_test_siglip_tiny(pretrained=False, **kwargs):  # kwargs: create_model's (pretrained_cfg, ...)
        return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0,
                                 class_token=False, act_layer="gelu_tanh", num_classes=kwargs.get("num_classes", 0),
                                 global_pool=kwargs.get("global_pool", "map"))

    register_model(vit_jax_test_siglip_tiny)


def open_clip_siglip(open_clip):
    """open_clip's SigLIP two towers at the test's size (ViT-B-16-SigLIP.json's settings, smaller)."""
    from open_clip.model import CustomTextCLIP

    vision = dict(image_size=16, timm_model_name=TIMM_NAME, timm_model_pretrained=False, timm_pool="map",
                  timm_proj="none")
    text = dict(context_length=TEXT.max_len, vocab_size=TEXT.vocab_size, width=TEXT.width, heads=TEXT.num_heads,
                layers=TEXT.depth, mlp_ratio=TEXT.mlp_dim / TEXT.width, no_causal_mask=True, proj_bias=True,
                pool_type="last", norm_kwargs={"eps": 1e-6}, act_kwargs={"approximate": "tanh"})
    return CustomTextCLIP(embed_dim=IMAGE.width, vision_cfg=vision, text_cfg=text, init_logit_bias=-10.0).eval()


def test_open_clip_reads_our_npz_to_the_same_embeddings(tmp_path):
    open_clip = require_open_clip()
    import timm
    import torch
    from open_clip.convert import load_big_vision_weights

    register_tiny_timm_vit(timm)
    spec = ImageTextSpec(IMAGE, TEXT, IMAGE.width, image_proj=False)
    rng = np.random.RandomState(0)
    params = jax.tree.map(lambda s: (0.3 * rng.standard_normal(s.shape)).astype(np.float32), spec.shapes())
    path = tmp_path / "siglip.npz"
    save_siglip_npz(str(path), params, spec)

    model = open_clip_siglip(open_clip)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    load_big_vision_weights(model, str(path))
    unread = [k for k, v in model.state_dict().items() if torch.equal(v, before[k])]
    assert not unread, unread  # every array of open_clip's model came from the file

    images = rng.uniform(-1, 1, (3, 16, 16, 3)).astype(np.float32)
    ids = rng.randint(0, TEXT.vocab_size, (3, TEXT.max_len))
    with torch.no_grad():
        theirs_img = model.encode_image(torch.from_numpy(images.transpose(0, 3, 1, 2)), normalize=True).numpy()
        theirs_txt = model.encode_text(torch.from_numpy(ids), normalize=True).numpy()
        theirs_t, theirs_b = float(model.logit_scale), float(model.logit_bias)

    loaded_spec, loaded = load_siglip_npz(str(path))
    bound = lambda p: loaded_spec.model().bind(p)  # noqa: E731
    ours_img, ours_txt, (t, b) = jax.jit(lambda p: (bound(p).embed_image(images), bound(p).embed_text(ids),
                                                    (p["t"], p["b"])))(loaded)
    np.testing.assert_allclose(np.asarray(ours_img), theirs_img, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ours_txt), theirs_txt, atol=1e-5)
    assert theirs_t == pytest.approx(float(np.asarray(t).reshape(-1)[0]))
    assert theirs_b == pytest.approx(float(np.asarray(b).reshape(-1)[0]))
