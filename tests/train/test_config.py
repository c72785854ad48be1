"""Config validation (unknown keys with the closest valid key, types) and durations resolved to steps."""

import pytest

from vit_jax.train.config import (ConfigError, check_override_keys, default_config, model_config, resolve_durations,
                                  validate)


def _valid():
    c = default_config()
    c.total_steps = 100
    return c


def test_a_config_needs_exactly_one_training_length():
    validate(_valid())  # the defaults plus a length are valid
    with pytest.raises(ConfigError, match="set exactly one of total_steps, total_epochs, total_examples .got none"):
        validate(default_config())
    c = _valid()
    c.total_epochs = 3.0
    with pytest.raises(ConfigError, match="got total_steps, total_epochs"):
        validate(c)


def test_unknown_key_names_the_closest_valid_key():
    c = _valid()
    c.optimizer.lr_rate = 0.1  # a typo that ConfigDict would otherwise keep silently
    with pytest.raises(ConfigError, match=r"unknown config key 'optimizer.lr_rate'; did you mean 'optimizer.lr'\?"):
        validate(c)
    c = _valid()
    c.optimzer = {"lr": 0.1}
    with pytest.raises(ConfigError, match="did you mean 'optimizer"):
        validate(c)


def test_override_flags_are_checked_before_parsing():
    check_override_keys(["--config.optimizer.lr=0.1", "--config.model.variant=B/16", "--workdir=x"])
    with pytest.raises(ConfigError, match="did you mean 'batch_size'"):
        check_override_keys(["--config.batchsize=3"])
    with pytest.raises(ConfigError, match="did you mean 'model.dropout'"):
        check_override_keys(["--config.model.dropuot=0.1"])


def test_wrong_types_and_choices():
    c = _valid()
    with pytest.raises(TypeError):  # ConfigDict itself refuses a type change on assignment
        c.batch_size = "large"
    c = _valid()  # a config file that rebuilds a section bypasses ConfigDict's check: validate() catches it
    c.optimizer = {**c.optimizer.to_dict(), "lr": "fast"}
    with pytest.raises(ConfigError, match=r"config key 'optimizer.lr' must be float, got 'fast' \(str\)"):
        validate(c)
    c = _valid()
    c.model = {**c.model.to_dict(), "scan": 1}
    with pytest.raises(ConfigError, match="config key 'model.scan' must be bool, got 1"):
        validate(c)
    c = _valid()
    c.optimizer.name = "adamm"
    with pytest.raises(ConfigError, match="choose one of adamw, sgd, adafactor"):
        validate(c)


def test_exactly_one_training_length_and_warmup():
    c = default_config()
    with pytest.raises(ConfigError, match="exactly one of total_steps, total_epochs, total_examples"):
        validate(c)
    c.total_steps, c.total_epochs = 10, 2.0
    with pytest.raises(ConfigError, match="exactly one"):
        validate(c)
    c = _valid()
    c.optimizer.warmup_steps, c.optimizer.warmup_epochs = 5, 1.0
    with pytest.raises(ConfigError, match="only one of"):
        validate(c)
    c = _valid()
    c.batch_size, c.micro_batches = 10, 3
    with pytest.raises(ConfigError, match="not divisible by micro_batches"):
        validate(c)


def test_durations_resolve_to_steps_in_one_place():
    c = default_config()
    c.batch_size = 100
    c.total_epochs = 2.5
    c.optimizer.warmup_examples = 250
    c.eval.every_epochs = 1.0
    c.checkpoint.every_steps = 7
    d = resolve_durations(c, train_examples=1000)
    assert (d.total_steps, d.warmup_steps, d.eval_every, d.checkpoint_every, d.fewshot_every) == (25, 3, 10, 7, 0)
    assert d.steps_per_epoch == 10
    c = default_config()
    c.batch_size, c.total_examples = 64, 1000
    assert resolve_durations(c, 5000).total_steps == 16  # ceil(1000 / 64)


def test_model_config_from_training_config():
    c = _valid()
    c.model.variant = "S/16"
    c.model.image_size = 64
    c.model.drop_path = 0.1
    m = model_config(c, num_classes=7)
    assert (m.width, m.depth, m.num_classes, m.image_size, m.drop_path) == (384, 12, 7, (64, 64), 0.1)
    c.model.variant = ""
    c.model.width, c.model.depth, c.model.mlp_dim, c.model.num_heads, c.model.patch_size = 32, 2, 64, 2, 8
    assert model_config(c, 3).name == "ViT-w32d2m64h2/8"


def test_a_hybrids_stem_width_comes_from_its_variant_unless_set():
    c = _valid()
    c.model.variant = "R50x2+B/16"
    m = model_config(c, num_classes=10)
    assert (m.resnet_layers, m.resnet_width, m.width) == ((3, 4, 9), 2, 768)
    c.model.resnet_width = 3
    assert model_config(c, num_classes=10).resnet_width == 3
    c.model.variant = "R50+B/16"
    c.model.resnet_width = 0
    assert model_config(c, num_classes=10).resnet_width == 1


def test_every_model_setting_is_a_config_key_written_once():
    """config.model is derived from ViTConfig: a new model option is a config key (validated) with no second list."""
    import dataclasses

    from vit_jax.models.config import ViTConfig

    from vit_jax.models import video_family

    c = _valid()
    # Plus the keys only the video family reads (its clip: frames, tubelet, encoder kind, temporal depth).
    video_only = {"num_frames", "tubelet", "video_encoder", "temporal_depth"}
    assert video_only <= set(video_family.SCHEMA)
    assert set(c.model) == {"variant"} | {f.name for f in dataclasses.fields(ViTConfig)} - {"num_classes"} | video_only
    # Every non-variant field reaches the model as given.
    c.model.update(gelu="erf", pool="gap", drop_path=0.1, rep_size=32, remat="dots", scan=True, posemb="sincos2d")
    m = model_config(c, num_classes=10)
    assert (m.gelu, m.pool, m.drop_path, m.rep_size, m.remat, m.scan, m.posemb) == (
        "erf", "gap", 0.1, 32, "dots", True, "sincos2d")


def test_an_empty_variant_needs_all_four_sizes():
    c = _valid()
    c.model.update(variant="", width=64, depth=2, mlp_dim=128)  # num_heads missing: not B's 12 heads silently
    with pytest.raises(ConfigError, match="model.variant is empty"):
        model_config(c, num_classes=10)
    c.model.num_heads = 4
    m = model_config(c, num_classes=10)
    assert (m.width, m.depth, m.mlp_dim, m.num_heads, m.patch_size) == (64, 2, 128, 4, (16, 16))


def test_evaluators_are_chosen_by_name(tmp_path):
    from types import SimpleNamespace

    from vit_jax.train import hooks
    from vit_jax.train.config import Durations

    c = _valid()
    ctx = hooks.HookContext(
        config=c, workdir=str(tmp_path), durations=Durations(10, 0, 5.0, 0, 0, 0), start_step=0, train_examples=10,
        dataset=SimpleNamespace(remote=False), program=None, hardware={}, progress={}, params=lambda: None,
        save_checkpoint=lambda *a, **k: None)

    def kinds():
        return [type(h).__name__ for h in hooks.default_hooks(ctx, writer=None)]

    assert kinds() == ["LogHook", "ObjectiveEvalHook", "FewShotHook", "CheckpointHook"]
    c.eval.evaluators = ("fewshot",)
    assert kinds() == ["LogHook", "FewShotHook", "CheckpointHook"]
    c.eval.evaluators = ("clasification",)
    with pytest.raises(ConfigError,
                       match=r"unknown evaluator\(s\) 'clasification'; known: classification, (\w+, )*fewshot"):
        kinds()


def test_windowed_attention_options_reach_the_model_and_are_validated():
    c = _valid()
    c.model.update(variant="B/16", image_size=448, pool="gap", window_size=14, global_blocks=[2, 5, 8, 11],
                   rel_pos=True)
    validate(c)
    m = model_config(c, num_classes=10)
    assert (m.window_size, m.global_blocks, m.rel_pos, m.num_classes) == (14, (2, 5, 8, 11), True, 10)
    c.model.pool = "token"
    with pytest.raises(ValueError, match="class token"):
        model_config(c, num_classes=10)
    c.model.update(window_size=0, global_blocks=[], pool="gap", dense=True)
    with pytest.raises(ConfigError, match="vit-jax predict --features"):  # the classification objective's check
        validate(c)
