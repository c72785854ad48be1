"""TFDS video datasets (ucf101 / kinetics-style: a `Video` feature of one encoded image per frame, and a label):
the parser keeps the frames encoded, `sample_clip(..., key=)` picks a clip's frames before `decode_frames` decodes
only those, `resize_clip` resizes every frame; the pipeline's clip batches equal a by-hand decode of the same frames
and are the same on one process as on two. Built here by a small local builder, as a user's own would write it."""

import numpy as np
import pytest

from tests.data.test_pipeline import load_local_batch, mesh_sharding, process_rows, take
from vit_jax.data import cv, datasets, decode, digits, pipeline, pp

NAME = "vit_jax_test_videos"
FRAMES = (5, 9, 12, 7, 10, 6, 11, 8)  # frames per video: longer and shorter than the sampled span of 7
EVAL_PP = "sample_clip(4, stride=2, random=False, key='video')|decode_frames('video')|resize_clip(16)|value_range(0,1)"
TRAIN_PP = "sample_clip(4, stride=2, key='video')|decode_frames('video')|resize_clip(16)|value_range(-1,1)|onehot(3)"


def video(i: int) -> np.ndarray:
    """Video i: FRAMES[i % 8] frames of 24x20, each frame's pixels its own index (so a clip shows which frames)."""
    rng = np.random.RandomState(i)
    frames = rng.randint(0, 200, (FRAMES[i % len(FRAMES)], 24, 20, 3)).astype(np.uint8)
    frames[:, 0, 0, 0] = np.arange(len(frames))
    return frames


@pytest.fixture(scope="module")
def videos_ds(tmp_path_factory):
    import tensorflow_datasets as tfds

    class Videos(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")
        code_path = url_infos = None  # nothing downloaded: no checksums file to look for beside the code

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "video": tfds.features.Video(shape=(None, 24, 20, 3)),
                "label": tfds.features.ClassLabel(num_classes=3)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(range(16)), "test": self._generate_examples(range(16, 22))}

        def _generate_examples(self, ids):
            for i in ids:
                yield i, {"video": video(i), "label": i % 3}

    Videos.name = NAME
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    Videos(data_dir=data_dir, file_format="array_record").download_and_prepare()
    return datasets.open_dataset(f"{NAME}:1.0.0", data_dir=data_dir, prepare=False)


def test_the_ops_sample_encoded_frames_then_decode_only_those():
    encoded = [digits.png_bytes(np.full((6, 4), f, np.uint8)) for f in range(9)]
    rng = np.random.default_rng(0)
    ex = pp.build("sample_clip(3, stride=3, random=False, key='video')")({"video": encoded, "label": 1}, rng)
    assert ex["video"] == [encoded[1], encoded[4], encoded[7]]  # centred, still encoded: only these get decoded
    ex = pp.build("decode_frames('video')|resize_clip(3, 2)")(ex, rng)
    assert "video" not in ex and ex["image"].shape == (3, 3, 2, 3) and ex["image"].dtype == np.uint8
    assert [int(f[0, 0, 0]) for f in ex["image"]] == [1, 4, 7]
    with pytest.raises(decode.DecodeError):  # a damaged frame: the record is bad (the pipeline substitutes it)
        pp.build("decode_frames('video')")({"video": [encoded[0], b"\x89PNG broken"]}, rng)
    with pytest.raises(ValueError, match="needs decoded frames: put `decode_frames` before it"):
        pp.build("resize_clip(4)")({"image": encoded}, rng)
    with pytest.raises(ValueError, match=r"decode_frames\('clip'\): the example has no sequence of encoded frames"):
        pp.build("decode_frames('clip')")({"video": encoded}, rng)


def test_clip_batches_equal_a_decode_by_hand_and_are_the_same_on_one_process_as_on_two(videos_ds):
    batch = take(pipeline.eval_iterator(videos_ds, "test", EVAL_PP, global_batch_size=8, sharding=mesh_sharding()),
                 1)[0]
    assert batch["image"].shape == (8, 4, 16, 16, 3) and batch["_mask"].tolist() == [1] * 6 + [0] * 2
    wanted = {}  # video id -> its clip decoded by hand (TFDS stores a split's records in its own order)
    for i in range(16, 22):
        frames = video(i)
        extra = len(frames) - 7  # the centred start of 4 frames 2 apart; shorter videos loop
        index = (extra // 2 + 2 * np.arange(4)) if extra >= 0 else (2 * np.arange(4)) % len(frames)
        wanted[i] = np.stack([cv.resize(f, 16, 16) for f in frames[index]]).astype(np.float32) / 255.0
    found = []
    for row in range(6):
        match = [i for i, want in wanted.items() if np.allclose(batch["image"][row], want, atol=1e-6)]
        assert len(match) == 1 and batch["label"][row] == match[0] % 3, (row, match)
        found += match
    assert sorted(found) == list(range(16, 22))

    stored = pipeline._Loader(videos_ds, "test", EVAL_PP, seed=0).source[0]["video"]
    assert isinstance(stored, list) and all(f.startswith(b"\x89PNG") for f in stored)  # read encoded, not decoded

    one = take(pipeline.train_iterator(videos_ds, pp=TRAIN_PP, global_batch_size=8, sharding=mesh_sharding((1, 1)),
                                       seed=5, num_workers=1), 2)
    assert one[0]["image"].shape == (8, 4, 16, 16, 3) and one[0]["labels"].shape == (8, 3)
    loader = pipeline._Loader(videos_ds, "train", TRAIN_PP, seed=5)
    plan = pipeline.BatchPlan(len(loader.source), 8, train=True, seed=5)
    parts = [load_local_batch(loader, plan, 1, *process_rows(8, p, 2)) for p in (0, 1)]
    for key in one[1]:
        np.testing.assert_array_equal(np.concatenate([parts[0][key], parts[1][key]]), one[1][key])


def test_multi_view_batches_decode_only_each_views_frames_and_equal_a_decode_by_hand(videos_ds):
    # 2 temporal x 3 spatial views: frames of 24x20 resized to 19x16 (short side 16), cropped at rows 0, 1 and 3
    views_pp = ("sample_clip(4, stride=2, random=False, key='video', views=2)|decode_frames('video')|"
                "resize_small_clip(16)|three_crop_clip(16)|value_range(0,1)")
    encoded = pp.build(views_pp.split("|decode")[0])({"video": [b"f%d" % f for f in range(9)]}, None)["video"]
    assert encoded == [[b"f0", b"f2", b"f4", b"f6"], [b"f2", b"f4", b"f6", b"f8"]]  # still encoded: only these decode
    batch = take(pipeline.eval_iterator(videos_ds, "test", views_pp, global_batch_size=8, sharding=mesh_sharding()),
                 1)[0]
    assert batch["image"].shape == (8, 6, 4, 16, 16, 3)
    wanted = {}  # video id -> its views decoded by hand
    for i in range(16, 22):
        frames = video(i)
        extra = len(frames) - 7
        starts = np.linspace(0, extra, 2).astype(int) if extra >= 0 else [0, 0]
        views = []
        for start in starts:
            clip = np.stack([cv.resize(f, 19, 16) for f in frames[(start + 2 * np.arange(4)) % len(frames)]])
            views += [clip[:, y:y + 16] for y in (0, 1, 3)]
        wanted[i] = np.stack(views).astype(np.float32) / 255.0
    found = [i for row in range(6) for i, want in wanted.items() if np.allclose(batch["image"][row], want, atol=1e-6)
             and batch["label"][row] == i % 3]
    assert sorted(found) == list(range(16, 22))


def test_resize_small_clip_keeps_the_aspect_ratio_of_every_frame():
    clip = np.random.default_rng(0).integers(0, 256, (3, 24, 40, 3), dtype=np.uint8)
    out = pp.build("resize_small_clip(12)")({"image": clip}, np.random.default_rng(0))["image"]
    assert out.shape == (3, 12, 20, 3)
    np.testing.assert_array_equal(out[1], cv.resize(clip[1], 12, 20))
