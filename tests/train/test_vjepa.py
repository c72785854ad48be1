"""V-JEPA: multi-block masks (ratios, static counts, the same positions in every time step), the EMA target encoder
(exact update, no gradient), the loss's gradients, averaged (data2vec) targets, the collapse check, its encoder
fine-tuning as a video classifier, and a run through the trainer resuming bit-identically from a mid-run checkpoint."""

import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.launch.helpers import losses
from tests.train.helpers import ROOT, apply_overrides
from vit_jax.checkpoints.surgery import adapt_params
from vit_jax.checkpoints.training import load_state_from_run
from vit_jax.models.build import build_model
from vit_jax.models.config import ModelConfigError
from vit_jax.models.video_config import video_config
from vit_jax.models.vjepa import VJEPAConfig, block_union, mask_order
from vit_jax.train.config import config_module
from vit_jax.train.objectives.vjepa import ENCODER, VJEPA, target_spread
from vit_jax.train.trainer import Trainer


@pytest.fixture(scope="module")
def objective():
    cfg = video_config("ViViT-B/8x2", width=32, depth=1, mlp_dim=64, num_heads=2, num_frames=4, image_size=32,
                       num_classes=0, pool="gap")
    o = VJEPA(cfg, VJEPAConfig(predictor_width=16, predictor_depth=1, predictor_heads=2))
    o.total_steps = 100
    params = o.model.init(jax.random.key(0))
    return o, params


@pytest.mark.parametrize("which", [0, 1])
def test_masks_cover_the_blocks_expected_share_in_every_time_step(which):
    spec = VJEPAConfig().masks()[which]  # the paper's: 8 blocks of 15% / 2 blocks of 70%, on ViT-L/16's 14x14 grid
    grid = (8, 14, 14)
    unions = jax.jit(jax.vmap(lambda k: block_union(k, spec, grid[1:])))(jax.random.split(jax.random.key(0), 200))
    k = spec.num_masked(grid[1:])
    assert abs(float(unions.mean()) - k / 196) < 0.03  # the fixed count is the blocks' expected coverage
    order = np.asarray(jax.jit(lambda k: mask_order(k, spec, grid))(jax.random.key(1)))
    assert sorted(order) == list(range(8 * 196))  # every token once: context first, then the targets
    targets = order[8 * (196 - k):].reshape(-1)
    per_step = [set(t % 196 for t in targets if t // 196 == s) for s in range(8)]
    assert all(len(p) == k and p == per_step[0] for p in per_step)  # blocks span the whole clip
    union = set(np.flatnonzero(np.asarray(block_union(jax.random.split(jax.random.key(1))[0], spec, grid[1:]))))
    assert union <= per_step[0] or per_step[0] <= union  # the union first, then trimmed or topped up at random


def test_the_target_encoder_is_an_exact_ema_of_the_encoder_without_gradient(objective):
    o, params = objective
    extra = o.init_extra(jax.random.key(0), params)
    assert set(extra) == set(ENCODER) and "predictor" not in extra
    moved = jax.tree.map(lambda p: p + 1.0, params)
    updated = jax.jit(o.update_extra)(extra, moved, jnp.asarray(25))
    m = 0.998 + (1.0 - 0.998) * 25 / 100
    for key in ENCODER:
        for new, old, p in zip(jax.tree.leaves(updated[key]), jax.tree.leaves(extra[key]),
                               jax.tree.leaves(moved[key])):
            np.testing.assert_allclose(new, m * old + (1 - m) * p, rtol=1e-6, atol=1e-7)
    batch = o.synthetic_batch(jax.random.key(1), 2)
    inputs = jax.jit(o.inputs)(batch, jax.random.key(2))
    g_params, g_extra = jax.jit(jax.grad(o.loss, argnums=(0, 3)))(params, inputs, jax.random.key(3), extra)
    assert all(not np.asarray(g).any() for g in jax.tree.leaves(g_extra))  # the target gets no gradient
    assert np.asarray(g_params["predictor"]["mask_tokens"]).any() and \
        np.asarray(g_params["encoder"]["blocks"]["mlp"]["fc1"]["kernel"]).any()


def test_the_pretrained_encoder_fine_tunes_as_a_video_classifier(objective):
    o, params = objective
    cfg = o.model.cfg.replace(num_classes=5)
    classifier = build_model(cfg)
    # init.reinit=("head", "predictor") when fine-tuning: the predictor is dropped, the head is new.
    tuned, notes = adapt_params(params, o.model.cfg, classifier.init(jax.random.key(1)), cfg,
                                reinit=("head", "predictor"))
    assert np.array_equal(tuned["embedding"]["kernel"], params["embedding"]["kernel"])
    assert "predictor" not in tuned and tuned["head"]["kernel"].shape == (32, 5)


def test_target_spread_is_the_mean_std_across_clips_and_zero_for_identical_clips(objective):
    # (B=3, N=1, D=2): rows 0 and 1 count, row 2 is padding. Channel 0: 0 and 2 (std 1); channel 1: 0 and 4 (std 2).
    targets = jnp.asarray([[[0.0, 0.0]], [[2.0, 4.0]], [[100.0, -100.0]]])
    assert float(target_spread(targets, jnp.asarray([1.0, 1.0, 0.0]))) == pytest.approx(1.5)
    assert float(target_spread(targets, jnp.asarray([1.0, 0.0, 0.0]))) == 0.0  # one clip: no spread
    # Through the evaluator: a batch of one clip repeated has target std 0 (what a collapsed encoder reports for any
    # batch); distinct clips give a spread of order 1 (the targets are layer-normalised per token).
    o, params = objective
    extra = o.init_extra(jax.random.key(0), params)
    step = jax.jit(o.eval_step())
    clips = o.synthetic_batch(jax.random.key(1), 4)["image"]
    mask = jnp.ones((4,), bool)
    same = step((params, extra), {"image": jnp.broadcast_to(clips[:1], clips.shape), "_mask": mask})
    distinct = step((params, extra), {"image": clips, "_mask": mask})
    assert float(same["target_std"]) == pytest.approx(0.0, abs=1e-5)
    assert 0.1 < float(distinct["target_std"]) / 4 < 2.0  # the step sums over the counted clips
    assert float(distinct["count"]) == 4.0


def test_averaged_targets_are_the_normalised_mean_of_the_last_blocks_normalised_outputs():
    cfg = video_config("ViViT-B/8x2", width=32, depth=3, mlp_dim=64, num_heads=2, num_frames=4, image_size=32,
                       num_classes=0, pool="gap")
    vj = VJEPAConfig(predictor_width=16, predictor_depth=1, predictor_heads=2)
    paper, averaged = VJEPA(cfg, vj), VJEPA(cfg, dataclasses.replace(vj, target_blocks=2))
    params = paper.model.init(jax.random.key(0))
    extra = paper.init_extra(None, params)
    clips = paper.synthetic_batch(jax.random.key(1), 2)["image"]
    model = paper.model.bind(params)
    final, blocks, _ = model.encoder(model.tokens(clips), capture_blocks=True)

    def norm(x):  # LayerNorm without affine parameters, in NumPy
        x = np.asarray(x, np.float64)
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)

    np.testing.assert_allclose(paper.targets(params, extra, clips), norm(final), atol=2e-5)  # the paper's
    np.testing.assert_allclose(averaged.targets(params, extra, clips),
                               norm((norm(blocks[1]) + norm(blocks[2])) / 2), atol=2e-5)
    with pytest.raises(ModelConfigError, match=r"vjepa.target_blocks \(4\) is more than the encoder's 3 blocks"):
        VJEPA(cfg, dataclasses.replace(vj, target_blocks=4))


def test_one_mask_type_per_step_is_that_types_loss_and_gradient_alone(objective):
    both, params = objective
    one = VJEPA(both.model.cfg, dataclasses.replace(both.vjepa, masks_per_step=1))
    one.total_steps = 100
    extra = one.init_extra(None, params)
    batch = one.synthetic_batch(jax.random.key(1), 4)

    @jax.jit
    def per_type(inputs):
        orders = (inputs["short"], inputs["long"])
        return [both.per_example_loss(params, extra, inputs["image"], orders, mask_type=i) for i in (0, 1)]

    inputs = jax.jit(both.inputs)(batch, jax.random.key(2))
    np.testing.assert_allclose(jax.jit(both.loss)(params, inputs, jax.random.key(3), extra),
                               np.mean(per_type(inputs)), rtol=1e-6)  # the paper's: both types, averaged
    loss_and_grad = jax.jit(jax.value_and_grad(one.loss))
    drawn = set()
    for k in range(6):
        inputs = jax.jit(one.inputs)(batch, jax.random.key(k))
        t = int(inputs["mask_type"][0])
        assert (np.asarray(inputs["mask_type"]) == t).all()  # one type for the whole step, in every micro-batch
        loss, grads = loss_and_grad(params, inputs, jax.random.key(100 + k), extra)  # the loss's key: not the draw
        losses = [float(x.mean()) for x in per_type(inputs)]
        np.testing.assert_allclose(loss, losses[t], rtol=1e-6)
        assert not np.isclose(losses[0], losses[1], rtol=1e-4)
        token_grads = np.asarray(grads["predictor"]["mask_tokens"])
        assert token_grads[t].any() and not token_grads[1 - t].any()  # the other type is not computed
        drawn.add(t)
    assert drawn == {0, 1}  # drawn from the step's key: both types occur
    # Half the context encoder and predictor, in expectation; the clip is embedded once a step either way.
    embed = both.flops.breakdown["embedding"]
    assert embed == one.flops.breakdown["embedding"] > 0
    np.testing.assert_allclose(one.flops.forward - embed, (both.flops.forward - embed) / 2, rtol=1e-12)
    with pytest.raises(ModelConfigError, match="vjepa.masks_per_step must be 1 or 2, not 3"):
        VJEPAConfig(masks_per_step=3)


def vjepa_run_config(data_dir, **overrides):
    """configs/demo_video.py made tiny for V-JEPA: 4 frames of 32 px in 2x8x8 tubelets (2x4x4 tokens), width 32,
    depth 1, a predictor of width 16 and depth 1; 4 steps of 8 clips, a checkpoint every 2."""
    c = config_module(ROOT / "configs" / "demo_video.py").get_config()
    clip = "decode_clip(16)|sample_clip(4, stride=2{})|value_range(-1,1)"
    return apply_overrides(c, {
        "objective": "vjepa", "data.data_dir": data_dir, "total_epochs": 0.0, "total_steps": 4, "batch_size": 8,
        "model.width": 32, "model.depth": 1, "model.mlp_dim": 64, "model.num_heads": 2, "model.num_frames": 4,
        "model.pool": "gap", "data.pp_train": clip.format(""), "data.pp_eval": clip.format(", random=False"),
        "vjepa.predictor_width": 16, "vjepa.predictor_depth": 1, "vjepa.predictor_heads": 2,
        "vjepa.ema_start": 0.9, "loss.label_smoothing": 0.0, "optimizer.warmup_epochs": 0.0,
        "optimizer.warmup_steps": 1, "log_every_steps": 1, "eval.every_epochs": 0.0, "eval.evaluators": (),
        "checkpoint.every_epochs": 0.0, "checkpoint.every_steps": 2, **overrides})


@pytest.fixture(scope="module")
def small_clips(tmp_path_factory):
    """moving_digits built with small splits (the generator is the same; only the counts differ)."""
    from vit_jax.data import datasets, moving_digits

    path = str(tmp_path_factory.mktemp("tfds_clips"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(moving_digits, "SPLITS", {"train": (0, 32), "test": (1, 8)})
        datasets.open_dataset("moving_digits", data_dir=path)
    return path


def test_a_vjepa_run_resumed_from_its_step_2_checkpoint_is_bit_identical(small_clips, tmp_path):
    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    trainer = Trainer(vjepa_run_config(small_clips), str(full_dir))
    summary = trainer.train()
    assert summary["status"] == "finished" and summary["steps"] == 4
    shutil.copytree(full_dir / "checkpoints" / "2", resumed_dir / "checkpoints" / "2")
    resumed = Trainer(vjepa_run_config(small_clips), str(resumed_dir))  # the same program: the compile cache's
    assert resumed.start_step == 2
    resumed.train()
    full = losses(full_dir)
    assert losses(resumed_dir) == {3: full[3], 4: full[4]}  # same masks and data order: bit-identical losses
    shapes = {"params": trainer.program.model.shapes, "extra": trainer.program.objective.extra_shapes()}
    a, b = (load_state_from_run(str(d), shapes)[1] for d in (full_dir, resumed_dir))
    assert set(a["extra"]) == set(ENCODER)  # the target encoder is saved with the parameters
    jax.tree.map(np.testing.assert_array_equal, a, b)
    # and the target encoder moved off the encoder (the EMA ran) without being equal to it
    assert not np.array_equal(a["extra"]["encoder"]["blocks"]["mlp"]["fc1"]["kernel"],
                              a["params"]["encoder"]["blocks"]["mlp"]["fc1"]["kernel"])
