"""Layer-wise lr decay (train/layer_decay.py, optimizer.layer_decay) and the MAE fine-tuning recipe (finetune.py)."""

import jax
import numpy as np
import optax
import pytest

from tests.train.test_shipped_configs import load
from vit_jax.models.bit_config import BiTConfig
from vit_jax.models.build import build_model
from vit_jax.models.config import vit_config
from vit_jax.models.vit import FunctionalViT
from vit_jax.train.config import ConfigError, default_config, model_config, resolve_durations, validate
from vit_jax.train.layer_decay import ScaleByLayerState, layer_scales
from vit_jax.train.optimizer import make_optimizer, make_schedule

DEPTH = 3
DECAY = 0.65
EMBEDDINGS = ("cls", "embedding", "pos_embedding")


def tiny(**kw) -> FunctionalViT:
    return FunctionalViT(vit_config(width=16, depth=DEPTH, mlp_dim=32, num_heads=2, patch_size=8, image_size=16,
                                    num_classes=4, **kw))


def optimizer_config(name: str, layer_decay: float, **kw):
    o = default_config().optimizer
    o.name, o.momentum, o.grad_clip_norm, o.layer_decay = name, 0.0, 0.0, layer_decay
    for k, v in kw.items():
        o[k] = v
    return o


def updates(model, o, schedule=optax.constant_schedule(0.5), steps=1):
    """The optimizer's update at step `steps` for fixed random parameters and gradients (of the model's shapes)."""
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(s.dtype), model.shapes)
    grads = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(s.dtype), model.shapes)
    tx = make_optimizer(o, schedule, model.shapes)

    @jax.jit
    def run(params, grads):
        state = tx.init(params)
        for _ in range(steps):
            u, state = tx.update(grads, state, params)
        return u, state

    u, state = run(params, grads)
    return jax.device_get(u), state


def assert_scaled(on, off, exact=True):
    """`on` is `off` scaled by decay^(L - i) in block row i, decay^(L + 1) in the embeddings, 1 elsewhere."""
    check = np.testing.assert_array_equal if exact else (lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-6))
    for name in EMBEDDINGS:
        for a, b in zip(jax.tree.leaves(on[name]), jax.tree.leaves(off[name])):
            check(a, np.float32(DECAY ** (DEPTH + 1)) * b)
    for a, b in zip(jax.tree.leaves(on["encoder"]["blocks"]), jax.tree.leaves(off["encoder"]["blocks"])):
        for i in range(DEPTH):
            check(a[i], np.float32(DECAY ** (DEPTH - i)) * b[i])
    jax.tree.map(np.testing.assert_array_equal, on["head"], off["head"])
    jax.tree.map(np.testing.assert_array_equal, on["encoder"]["norm"], off["encoder"]["norm"])


def test_sgd_step_scales_each_stacked_block_row_by_decay_powers():
    model = tiny()
    on, _ = updates(model, optimizer_config("sgd", DECAY))
    off, _ = updates(model, optimizer_config("sgd", 0.0))
    assert_scaled(on, off)  # bit-exact: lr 0.5 is a power of two, so only the scale rounds


def test_adamw_with_weight_decay_is_scaled_as_a_whole_step():
    # BEiT/MAE scale a parameter group's lr, which multiplies AdamW's decoupled weight decay too.
    model = tiny()
    on, _ = updates(model, optimizer_config("adamw", DECAY, weight_decay=0.05))
    off, _ = updates(model, optimizer_config("adamw", 0.0, weight_decay=0.05))
    assert_scaled(on, off)


def test_momentum_and_a_warmup_cosine_schedule_keep_the_ratios():
    model = tiny()
    schedule = make_schedule(optimizer_config("sgd", 0.0), total_steps=10, warmup_steps=2)
    on, _ = updates(model, optimizer_config("sgd", DECAY, momentum=0.9), schedule, steps=3)
    off, _ = updates(model, optimizer_config("sgd", 0.0, momentum=0.9), schedule, steps=3)
    assert_scaled(on, off, exact=False)  # lr 1e-3 x cosine: one rounding more than the scale


@pytest.mark.parametrize("off", [0.0, 1.0])
def test_off_adds_nothing_to_the_optimizer(off):
    model = tiny()
    u, state = updates(model, optimizer_config("adamw", off, weight_decay=0.05))
    ref, ref_state = updates(model, optimizer_config("adamw", 0.0, weight_decay=0.05))
    jax.tree.map(np.testing.assert_array_equal, u, ref)
    # Same optimizer state as before the option existed: old checkpoints restore.
    assert jax.tree.structure(state) == jax.tree.structure(ref_state)
    assert not any(isinstance(s, ScaleByLayerState) for s in state)
    _, on_state = updates(model, optimizer_config("adamw", DECAY, weight_decay=0.05))
    assert any(isinstance(s, ScaleByLayerState) for s in on_state)


def test_scales_of_a_hybrid_stem_and_of_relative_position_tables():
    hybrid = FunctionalViT(vit_config(width=16, depth=DEPTH, mlp_dim=32, num_heads=2, patch_size=1, image_size=64,
                                      num_classes=4, resnet_layers=(1,), resnet_width=1))
    scales = layer_scales(hybrid.shapes, DECAY)
    assert set(jax.tree.leaves(scales["stem"])) == {DECAY ** (DEPTH + 1)}  # the stem is part of the embedding
    sam = FunctionalViT(vit_config(width=16, depth=DEPTH, mlp_dim=32, num_heads=2, patch_size=8, image_size=32,
                                   num_classes=4, pool="gap", rel_pos=True, window_size=2, global_blocks=(2,)))
    scales = layer_scales(sam.shapes, DECAY)
    for i in range(DEPTH):
        assert jax.tree.leaves(scales["encoder"][f"rel_pos_{i}"]) == pytest.approx([DECAY ** (DEPTH - i)] * 2)


def test_a_bit_resnet_is_refused():
    bit = build_model(BiTConfig(layers=(1,), width_factor=1, num_classes=4))
    o = optimizer_config("sgd", DECAY)
    with pytest.raises(ConfigError, match="layer_decay needs a ViT"):
        make_optimizer(o, optax.constant_schedule(0.1), bit.shapes)


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_layer_decay_out_of_range_is_a_config_error(bad):
    c = load("finetune").get_config("dataset=cifar10,variant=B/16")
    c.optimizer.layer_decay = bad
    with pytest.raises(ConfigError, match="layer_decay=.*give a factor in"):
        validate(c)


def test_mae_pretraining_refuses_layer_decay():
    c = load("vit_mae").get_config("variant=B/16")
    c.optimizer.layer_decay = 0.75
    with pytest.raises(ConfigError, match="layer_decay is for fine-tuning"):
        validate(c)


IMAGENET_TRAIN = 1_281_167


@pytest.mark.parametrize("variant,lr,decay,drop_path,epochs", [
    ("B/16", 5e-4 * 4, 0.65, 0.1, 100.0), ("L/16", 1e-3 * 4, 0.75, 0.2, 50.0), ("H/14", 1e-3 * 4, 0.75, 0.3, 50.0)])
def test_mae_finetune_recipe(variant, lr, decay, drop_path, epochs):
    c = load("finetune").get_config(f"dataset=imagenet2012,init=mae_run,variant={variant},recipe=mae")
    validate(c)
    o = c.optimizer
    assert (o.name, o.b1, o.b2, o.weight_decay, o.grad_clip_norm, o.schedule, o.layer_decay) == (
        "adamw", 0.9, 0.999, 0.05, 0.0, "cosine", decay)
    assert o.lr == pytest.approx(lr)  # base lr x 1024 / 256
    assert (c.batch_size, c.total_epochs, o.warmup_epochs) == (1024, epochs, 5.0)
    assert (c.loss.mixup_alpha, c.loss.label_smoothing) == (0.8, 0.1)
    assert "randaug(2,9)" in c.data.pp_train
    m = model_config(c, num_classes=1000)
    assert (m.drop_path, m.image_size, m.posemb, m.pool) == (drop_path, (224, 224), "sincos2d", "token")
    d = resolve_durations(c, IMAGENET_TRAIN)
    assert d.warmup_steps == pytest.approx(5 * IMAGENET_TRAIN / 1024, abs=1)
    assert d.total_steps == pytest.approx(epochs * IMAGENET_TRAIN / 1024, abs=1)


def test_mae_recipe_scales_of_vit_b16():
    c = load("finetune").get_config("dataset=imagenet2012,init=mae_run,variant=B/16,recipe=mae")
    scales = layer_scales(FunctionalViT(model_config(c, num_classes=1000)).shapes, c.optimizer.layer_decay)
    assert scales["embedding"]["kernel"] == pytest.approx(0.65 ** 13)
    rows = scales["encoder"]["blocks"]["mlp"]["fc1"]["kernel"]
    assert rows.shape == (12, 1, 1)
    np.testing.assert_allclose(rows[:, 0, 0], 0.65 ** (12 - np.arange(12)), rtol=1e-6)
    assert scales["head"]["kernel"] == scales["encoder"]["norm"]["scale"] == 1.0


def test_mae_recipe_with_steps_and_its_errors():
    ft = load("finetune")
    c = ft.get_config("dataset=digits,init=mae_run,variant=B/16,recipe=mae,steps=200,batch=64,resolution=32")
    validate(c)
    assert (c.total_steps, c.total_epochs, c.optimizer.warmup_steps, c.batch_size) == (200, 0.0, 10, 64)
    assert c.optimizer.lr == pytest.approx(5e-4 * 64 / 256)
    with pytest.raises(ConfigError, match="recipe=mae needs variant=B/16, L/16 or H/14"):
        ft.get_config("dataset=cifar10,init=mae_run,recipe=mae")
    with pytest.raises(ConfigError, match="give hyperrule= or recipe=, not both"):
        ft.get_config("dataset=cifar10,variant=B/16,recipe=mae,hyperrule=bit")
    with pytest.raises(ConfigError, match="the only recipe is 'mae'"):
        ft.get_config("dataset=cifar10,variant=B/16,recipe=beit")
