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


def register_tiny_timm_vit(timm, image) -> str:
    """A timm ViT shaped as `image` (no class token, MAP pooling, tanh GELU) registered under a name of its own:
    open_clip builds its image tower with timm.create_model(name, num_classes=0, global_pool='map')."""
    from timm.models import register_model
    from timm.models.vision_transformer import VisionTransformer

    name = (f"vit_jax_test_siglip_{image.image_size[0]}_p{image.patch_size[0]}_w{image.width}_d{image.depth}"
            f"_h{image.num_heads}_m{image.mlp_dim}")
    if timm.models.is_model(name):
        return name

    def create(pretrained=False, **kwargs):  # kwargs: create_model's (pretrained_cfg, ...)
        return VisionTransformer(img_size=image.image_size[0], patch_size=image.patch_size[0], embed_dim=image.width,
                                 depth=image.depth, num_heads=image.num_heads, mlp_ratio=image.mlp_dim / image.width,
                                 class_token=False, act_layer="gelu_tanh", num_classes=kwargs.get("num_classes", 0),
                                 global_pool=kwargs.get("global_pool", "map"))

    create.__name__ = name  # timm registers a model under its function's name
    register_model(create)
    return name


def open_clip_siglip(timm, image, text):
    """open_clip's SigLIP two towers at these sizes (ViT-B-16-SigLIP.json's settings, smaller), random weights."""
    from open_clip.model import CustomTextCLIP

    vision = dict(image_size=image.image_size[0], timm_model_name=register_tiny_timm_vit(timm, image),
                  timm_model_pretrained=False, timm_pool="map", timm_proj="none")
    text_cfg = dict(context_length=text.max_len, vocab_size=text.vocab_size, width=text.width, heads=text.num_heads,
                    layers=text.depth, mlp_ratio=text.mlp_dim / text.width, no_causal_mask=True, proj_bias=True,
                    pool_type="last", norm_kwargs={"eps": 1e-6}, act_kwargs={"approximate": "tanh"})
    return CustomTextCLIP(embed_dim=image.width, vision_cfg=vision, text_cfg=text_cfg, init_logit_bias=-10.0).eval()


def open_clip_embeddings(timm, image, text, path, images, ids):
    """(image embeddings, text embeddings, t, b) of the .npz at `path` read by open_clip's own big_vision loader,
    after checking that the loader filled every array of open_clip's model."""
    import torch
    from open_clip.convert import load_big_vision_weights

    model = open_clip_siglip(timm, image, text)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    load_big_vision_weights(model, str(path))
    unread = [k for k, v in model.state_dict().items() if torch.equal(v, before[k])]
    assert not unread, unread  # every array of open_clip's model came from the file
    with torch.no_grad():
        zimg = model.encode_image(torch.from_numpy(images.transpose(0, 3, 1, 2)), normalize=True).numpy()
        ztxt = model.encode_text(torch.from_numpy(ids), normalize=True).numpy()
        return zimg, ztxt, float(model.logit_scale), float(model.logit_bias)


def test_open_clip_reads_our_npz_to_the_same_embeddings(tmp_path):
    require_open_clip()
    import timm

    spec = ImageTextSpec(IMAGE, TEXT, IMAGE.width, image_proj=False)
    rng = np.random.RandomState(0)
    params = jax.tree.map(lambda s: (0.3 * rng.standard_normal(s.shape)).astype(np.float32), spec.shapes())
    path = tmp_path / "siglip.npz"
    save_siglip_npz(str(path), params, spec)

    images = rng.uniform(-1, 1, (3, 16, 16, 3)).astype(np.float32)
    ids = rng.randint(0, TEXT.vocab_size, (3, TEXT.max_len))
    theirs_img, theirs_txt, theirs_t, theirs_b = open_clip_embeddings(timm, IMAGE, TEXT, path, images, ids)

    loaded_spec, loaded = load_siglip_npz(str(path))
    bound = lambda p: loaded_spec.model().bind(p)  # noqa: E731
    ours_img, ours_txt, (t, b) = jax.jit(lambda p: (bound(p).embed_image(images), bound(p).embed_text(ids),
                                                    (p["t"], p["b"])))(loaded)
    np.testing.assert_allclose(np.asarray(ours_img), theirs_img, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ours_txt), theirs_txt, atol=1e-5)
    assert theirs_t == pytest.approx(float(np.asarray(t).reshape(-1)[0]))
    assert theirs_b == pytest.approx(float(np.asarray(b).reshape(-1)[0]))


@pytest.mark.slow
def test_a_run_without_an_image_projection_opens_in_open_clip(tmp_path, digits_data_dir, monkeypatch, request):
    """End to end: a 2-step SigLIP run of both towers with `siglip.image_proj=False` (the demo's data, the towers
    tiny), written by `vit-jax convert --to siglip` (no `img/head`), and read by open_clip's loader:
    open_clip's embeddings, t and b are the run's own."""
    require_open_clip()
    import timm

    from tests.train.test_image_text_training import clip_config
    from vit_jax.commands import convert
    from vit_jax.data import text_ops
    from vit_jax.train.trainer import Trainer

    monkeypatch.setenv("VIT_JAX_CACHE", str(tmp_path / "cache"))
    text_ops.forget_run_tokenizers()
    request.addfinalizer(text_ops.forget_run_tokenizers)  # the run makes 'digits' mean its workdir's copy
    c = clip_config(digits_data_dir, **{"siglip.image_proj": False})
    trainer = Trainer(c, str(tmp_path / "run"))
    trainer.train()
    path = tmp_path / "siglip.npz"
    assert convert.main(["--checkpoint", str(tmp_path / "run"), "--output", str(path), "--to", "siglip"]) == 0
    assert not any(k.startswith("img/head") for k in np.load(path).files)

    objective = trainer.program.objective
    rng = np.random.RandomState(2)
    images = rng.uniform(-1, 1, (4, 16, 16, 3)).astype(np.float32)
    ids = rng.randint(0, c.siglip.text_vocab_size, (4, c.siglip.text_max_len)).astype(np.int32)
    params = jax.device_get(trainer.state["params"])
    ours_img, ours_txt, t, b = jax.jit(objective.embed)(params, None, images, ids)
    theirs = open_clip_embeddings(timm, objective.model.cfg, objective.text_cfg, path, images, ids)
    np.testing.assert_allclose(theirs[0], np.asarray(ours_img), atol=1e-5)
    np.testing.assert_allclose(theirs[1], np.asarray(ours_txt), atol=1e-5)
    assert theirs[2] == pytest.approx(float(np.log(t))) and theirs[3] == pytest.approx(float(b))
