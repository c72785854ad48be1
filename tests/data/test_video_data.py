"""Video data: the generated moving-digits clips, the clip ops (decode, temporal sampling, one spatial crop per
clip) and the pipeline's clip batches, the same on one process as on two."""

import numpy as np
import pytest

from vit_jax.data import moving_digits, pipeline, pp
from tests.data.test_pipeline import digest, load_local_batch, mesh_sharding, process_rows, take

TRAIN_PP = "decode_clip(16)|sample_clip(8, stride=2)|random_crop_clip(28)|value_range(-1, 1)|onehot(40)"


@pytest.fixture(scope="module")
def clips_ds(tmp_path_factory):
    """moving_digits built with small splits (the generator is the same; only the counts differ)."""
    from vit_jax.data import datasets

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(moving_digits, "SPLITS", {"train": (0, 48), "test": (1, 8)})
        return datasets.open_dataset("moving_digits", data_dir=str(tmp_path_factory.mktemp("tfds")))


def _centre(frame: np.ndarray) -> np.ndarray:
    rows, cols = np.nonzero(frame)
    return np.array([rows.mean(), cols.mean()])


def test_a_clip_moves_its_digit_in_its_direction_and_is_the_same_on_every_build():
    from sklearn.datasets import load_digits

    data = load_digits()
    pool = np.arange(100)
    for i in range(12):
        ex = moving_digits.example(data.images, data.target, pool, np.random.default_rng([0, 0, i]))
        again = moving_digits.example(data.images, data.target, pool, np.random.default_rng([0, 0, i]))
        assert np.array_equal(ex["frames"], again["frames"]) and ex["label"] == again["label"]
        frames = ex["frames"]
        assert frames.shape == (16, 32, 32) and ex["label"] == 4 * ex["digit"] + ex["direction"]
        ink = frames.reshape(16, -1).sum(1)
        assert np.all(ink == ink[0])  # the whole digit stays inside every frame
        step = (_centre(frames[-1]) - _centre(frames[0])) / 15
        expect = np.array(list(moving_digits.DIRECTIONS.values())[ex["direction"]])
        speed = float(np.abs(step).max())
        assert min(moving_digits.SPEEDS) - 0.1 <= speed <= max(moving_digits.SPEEDS) + 0.1
        np.testing.assert_allclose(step, expect * speed, atol=0.1)


def test_clip_ops_sample_in_time_and_crop_every_frame_alike():
    pp.load_modules()
    frames = np.arange(16)[:, None, None, None] * np.ones((1, 6, 6, 3), np.uint8)  # frame f is filled with f
    ex = {"image": frames}
    rng = lambda: np.random.default_rng(0)  # noqa: E731
    starts = {int(pp._REGISTRY["sample_clip"](4, stride=3)(ex, np.random.default_rng(s))["image"][0, 0, 0, 0])
              for s in range(40)}
    assert starts == {0, 1, 2, 3, 4, 5, 6}  # every start whose 10-frame span fits in 16 frames
    central = pp._REGISTRY["sample_clip"](4, stride=3, random=False)(ex, rng())["image"][:, 0, 0, 0]
    assert list(central) == [3, 6, 9, 12]
    looped = pp._REGISTRY["sample_clip"](6, stride=4, random=False)(ex, rng())["image"][:, 0, 0, 0]
    assert list(looped) == [0, 4, 8, 12, 0, 4]  # shorter than the span: looped
    marked = np.zeros((3, 8, 8, 3), np.uint8)
    marked[:, 2, 5] = 255  # the same pixel marked in every frame
    crop = pp._REGISTRY["random_crop_clip"](4)({"image": marked}, rng())["image"]
    assert crop.shape == (3, 4, 4, 3)
    assert all(np.array_equal(np.argwhere(crop[f, :, :, 0]), np.argwhere(crop[0, :, :, 0])) for f in range(3))
    with pytest.raises(ValueError, match="needs a decoded clip"):
        pp._REGISTRY["sample_clip"](4)({"image": b"png"}, rng())


def test_evaluation_views_are_evenly_spaced_clips_and_three_crops_along_the_longer_side():
    pp.load_modules()
    frames = np.arange(16)[:, None, None, None] * np.ones((1, 6, 6, 3), np.uint8)  # frame f is filled with f
    rng = np.random.default_rng(0)
    views = pp.build("sample_clip(4, stride=3, random=False, views=3)")({"image": frames}, rng)["image"]
    assert views.shape == (3, 4, 6, 6, 3)  # starts 0, 3, 6: the first and the last window of the 10-frame span
    assert views[:, :, 0, 0, 0].tolist() == [[0, 3, 6, 9], [3, 6, 9, 12], [6, 9, 12, 15]]
    short = pp.build("sample_clip(6, stride=4, random=False, views=2)")({"image": frames}, rng)["image"]
    assert short[:, :, 0, 0, 0].tolist() == [[0, 4, 8, 12, 0, 4]] * 2  # shorter than the span: the looped clip
    with pytest.raises(ValueError, match="evenly spaced evaluation views: give random=False"):
        pp.build("sample_clip(4, views=2)")
    with pytest.raises(ValueError, match="sample once, with views="):
        pp.build("sample_clip(2)")({"image": views}, rng)

    wide = np.random.default_rng(1).integers(0, 256, (2, 4, 8, 3), dtype=np.uint8)  # frames 4 high, 8 wide
    crops = pp.build("three_crop_clip(4)")({"image": wide}, rng)["image"]
    assert crops.shape == (3, 2, 4, 4, 3)
    for crop, x in zip(crops, (0, 2, 4)):  # left, centre, right, each through every frame
        np.testing.assert_array_equal(crop, wide[:, :, x:x + 4])
    tall = np.swapaxes(wide, 1, 2)
    crops = pp.build("three_crop_clip(4)")({"image": tall}, rng)["image"]
    for crop, y in zip(crops, (0, 2, 4)):  # top, centre, bottom
        np.testing.assert_array_equal(crop, tall[:, y:y + 4])
    # the ops between sampling and cropping treat every view alike; the three crops of a view stay together
    two = np.stack([wide, wide[::-1]])
    out = pp.build("resize_small_clip(2)|three_crop_clip(2)|value_range(-1,1)")({"image": two}, rng)["image"]
    assert out.shape == (6, 2, 2, 2, 3)
    one = pp.build("resize_small_clip(2)|three_crop_clip(2)|value_range(-1,1)")({"image": wide[::-1]}, rng)["image"]
    np.testing.assert_array_equal(out[3:], one)
    with pytest.raises(ValueError, match=r"three_crop_clip\(5\) on frames of \(4, 8\)"):
        pp.build("three_crop_clip(5)")({"image": wide}, rng)


def test_clip_batches_are_tubelet_ready_and_the_same_on_one_process_as_on_two(clips_ds):
    it = pipeline.train_iterator(clips_ds, pp=TRAIN_PP, global_batch_size=16, sharding=mesh_sharding(), seed=3)
    batch = take(it, 1)[0]
    assert batch["image"].shape == (16, 8, 28, 28, 3) and batch["labels"].shape == (16, 40)
    assert -1.0 <= batch["image"].min() and batch["image"].max() <= 1.0
    one = take(pipeline.train_iterator(clips_ds, pp=TRAIN_PP, global_batch_size=16, sharding=mesh_sharding((1, 1)),
                                       seed=3, num_workers=1), 2)
    eight = take(pipeline.train_iterator(clips_ds, pp=TRAIN_PP, global_batch_size=16, sharding=mesh_sharding(),
                                         seed=3, num_workers=2), 2)
    assert [digest(b) for b in one] == [digest(b) for b in eight] and digest(one[0]) == digest(batch)
    # Two processes, each loading its half of the rows, hold exactly the one-process batch.
    loader = pipeline._Loader(clips_ds, "train", TRAIN_PP, seed=3)
    plan = pipeline.BatchPlan(len(loader.source), 16, train=True, seed=3)
    parts = [load_local_batch(loader, plan, 1, *process_rows(16, p, 2)) for p in (0, 1)]
    for key in one[1]:
        np.testing.assert_array_equal(np.concatenate([parts[0][key], parts[1][key]]), one[1][key])
