"""The video configs: demo_video and vivit validate, build the video model they describe, and carry the recipe."""

import pytest

from tests.train.test_shipped_configs import load
from vit_jax.models.video_config import VideoConfig
from vit_jax.train.config import model_config, validate


def test_demo_video_builds_a_joint_video_vit_on_moving_digits():
    c = load("demo_video").get_config()
    validate(c)
    cfg = model_config(c, num_classes=40)
    assert isinstance(cfg, VideoConfig) and (cfg.encoder, cfg.grid, cfg.width) == ("joint", (4, 4, 4), 64)
    assert c.data.name == "moving_digits" and "sample_clip(8, stride=2, random=False)" in c.data.pp_eval


def test_vivit_is_scenics_kinetics_factorised_encoder_recipe():
    c = load("vivit").get_config("init=vit_b16.npz")
    validate(c)
    cfg = model_config(c, num_classes=400)
    assert (cfg.name, cfg.num_frames, cfg.grid, cfg.num_temporal_blocks) == ("ViViT-FE-B/16x2", 32, (16, 14, 14), 4)
    o = c.optimizer
    assert (o.name, o.momentum, o.lr, o.warmup_epochs, o.schedule, o.grad_clip_norm, o.weight_decay) == (
        "sgd", 0.9, 0.05, 2.5, "cosine", 1.0, 0.0)
    assert (c.batch_size, c.total_epochs, c.init.checkpoint, c.init.required) == (64, 30.0, "vit_b16.npz", True)
    assert "sample_clip(32, stride=2)" in c.data.pp_train and "resize_small_clip(256)|random_crop_clip(224)" in (
        c.data.pp_train)
    # ucf101 / kinetics-style TFDS builders: a Video feature, sampled encoded and then decoded
    c = load("vivit").get_config("init=vit_b16.npz,data=ucf101,video=video")
    validate(c)
    assert c.data.pp_train.startswith("sample_clip(32, stride=2, key='video')|decode_frames('video')|")
    assert c.data.pp_eval.startswith("sample_clip(32, stride=2, random=False, key='video')|decode_frames('video')|")
    # the paper's 4 temporal x 3 spatial evaluation views
    views = load("vivit").get_config("init=vit_b16.npz,data=ucf101,video=video,views=4x3")
    validate(views)
    assert views.data.pp_eval == ("sample_clip(32, stride=2, random=False, views=4, key='video')|"
                                  "decode_frames('video')|resize_small_clip(256)|three_crop_clip(224)|"
                                  "value_range(-1,1)")
    assert views.data.pp_train == c.data.pp_train
    with pytest.raises(ValueError, match="views='4'; give TxS"):
        load("vivit").get_config("init=vit_b16.npz,views=4")
    from vit_jax.data import pp
    for spec in (c.data.pp_train, c.data.pp_eval, views.data.pp_eval):
        pp.build(spec)  # every op exists and takes its arguments


def test_vjepa_pretrains_a_headless_joint_vit_l_with_the_papers_masks():
    from vit_jax.models.vjepa import VJEPAConfig
    from vit_jax.train.objectives import vjepa_config

    c = load("vjepa").get_config("data=clips")
    validate(c)
    cfg = model_config(c, num_classes=0)
    assert (cfg.name, cfg.grid, cfg.pool, cfg.num_classes) == ("ViViT-L/16x2", (8, 14, 14), "gap", 0)
    assert vjepa_config(c) == VJEPAConfig()  # predictor 12 x 384, 8 x 15% and 2 x 70% blocks, EMA 0.998 -> 1
    assert (c.objective, c.optimizer.lr, c.optimizer.grad_clip_norm) == ("vjepa", 6.25e-4, 10.0)
