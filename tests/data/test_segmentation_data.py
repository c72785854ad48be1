"""Segmentation data: the generated `digits_mosaic` builder, and the ops that keep image and label map aligned."""

import io

import numpy as np
import pytest
from PIL import Image

from vit_jax.data import decode, digits, digits_mosaic, pp


def run(ops: str, ex: dict, seed: int = 0) -> dict:
    return pp.build(ops)(dict(ex), np.random.default_rng(seed))


# ---------------------------------------------------------------------------------------------------------------------
# digits_mosaic

def test_mosaic_splits_shapes_and_classes(mosaic_data_dir):
    from vit_jax.data import datasets

    ds = datasets.open_dataset("digits_mosaic", data_dir=mosaic_data_dir, prepare=False)
    assert {s: ds.num_examples(s) for s in ds.splits} == {"train": 2000, "test": 500}
    seen = set()
    for split in ("train", "test"):
        for i in range(0, ds.num_examples(split), 50):
            ex = run("decode|decode_mask", ds.source(split)[i])
            image, seg = ex["image"], ex["segmentation"]
            assert image.shape == (32, 32, 3) and image.dtype == np.uint8
            assert seg.shape == (32, 32) and seg.dtype == np.uint8
            seen |= set(np.unique(seg).tolist())
            # The label is a function of what is seen: labelled ink is bright, background never is.
            assert image[seg > 0, 0].min() >= digits_mosaic.INK_MIN
            assert image[seg == 0, 0].max() < digits_mosaic.INK_MIN
    assert seen == set(range(digits_mosaic.NUM_CLASSES))


def test_mosaic_is_deterministic_and_draws_only_its_splits_digits(mosaic_data_dir):
    from sklearn.datasets import load_digits

    from vit_jax.data import datasets

    data = load_digits()
    pools = digits.split_indices(data.target)
    assert not set(pools["train"]) & set(pools["test"])  # test digits never appear in train mosaics
    ds = datasets.open_dataset("digits_mosaic", data_dir=mosaic_data_dir, prepare=False)
    for split, i in (("train", 0), ("train", 1999), ("test", 7)):
        source = ds.source(split)  # TFDS stores a split's examples in an order of its own: find it by id
        record = next(r for r in (source[j] for j in range(len(source)))
                      if r["id"] == f"mosaic_{split}_{i:05d}".encode())
        stored = run("decode|decode_mask", record)
        rng = np.random.default_rng([digits_mosaic.SEED, digits_mosaic.SPLITS[split][0], i])
        image, seg = digits_mosaic.mosaic(data.images, data.target, pools[split], rng)
        np.testing.assert_array_equal(stored["image"], image)
        np.testing.assert_array_equal(stored["segmentation"], seg)
    # A mosaic only uses the pool it is given: with one digit, only its class appears.
    one = pools["test"][:1]
    _, seg = digits_mosaic.mosaic(data.images, data.target, one, np.random.default_rng(3))
    assert set(np.unique(seg).tolist()) <= {0, 1 + int(data.target[one[0]])}


# ---------------------------------------------------------------------------------------------------------------------
# Ops: the label map moves with the image.

def blocks(size: int = 48, block: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An image of constant blocks and its label map (class = block value // 20): alignment is checkable."""
    rng = np.random.default_rng(seed)
    classes = rng.integers(0, 12, (size // block, size // block)).astype(np.uint8)
    seg = np.kron(classes, np.ones((block, block), np.uint8))
    return np.repeat((seg * 20 + 5)[:, :, None], 3, axis=2).astype(np.uint8), seg


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def example(image, seg):
    return {"image": png(image), "segmentation": png(seg)}


@pytest.mark.parametrize("ops", ["random_crop(24)|flip_lr", "central_crop(30, 20)|flip_lr(1.0)",
                                 "resize(24)|random_crop(16, 20)"])
def test_crops_flips_and_2x_resizes_move_the_map_exactly(ops):
    image, seg = blocks()
    for seed in range(4):
        ex = run(f"decode|decode_mask|{ops}", example(image, seg), seed)
        assert ex["segmentation"].shape == ex["image"].shape[:2]
        np.testing.assert_array_equal(ex["segmentation"], ex["image"][:, :, 0] // 20)


@pytest.mark.parametrize("ops", ["inception_crop(40)|flip_lr", "resize_small(56)|random_crop(40)", "resize(37, 29)"])
def test_any_resize_keeps_the_map_aligned(ops):
    # Bilinear image vs nearest map differ only along block edges: every block interior agrees.
    image, seg = blocks()
    for seed in range(4):
        ex = run(f"decode|decode_mask|{ops}", example(image, seg), seed)
        out, labels = ex["image"][:, :, 0].astype(int), ex["segmentation"].astype(int)
        assert labels.shape == out.shape
        from_image = np.rint((out - 5) / 20).astype(int)
        assert np.mean(from_image == labels) > 0.8
        # Pixels whose 3x3 neighbourhood is one value are inside a block, away from any blending.
        windows = np.lib.stride_tricks.sliding_window_view(np.pad(out, 1, mode="edge"), (3, 3))
        interior = windows.min(axis=(2, 3)) == windows.max(axis=(2, 3))
        assert interior.mean() > 0.25 and np.array_equal(from_image[interior], labels[interior])


def test_decode_mask_reads_another_key_and_refuses_bad_orders():
    image, seg = blocks(16, 4)
    raw = example(image, seg)
    ex = run("decode|decode_mask('segmentation_mask')|resize(8)",
             {"image": raw["image"], "segmentation_mask": raw["segmentation"]})
    assert "segmentation_mask" not in ex and ex["segmentation"].shape == (8, 8)
    with pytest.raises(ValueError, match="put `decode_mask` before it"):
        run("decode|resize(8)|decode_mask", raw)
    with pytest.raises(ValueError, match="no 'segmentation_mask'"):
        run("decode|decode_mask('segmentation_mask')", raw)
    with pytest.raises(ValueError, match="randaug does not move a segmentation map"):
        run("decode|decode_mask|randaug(2, 5)", raw)
    with pytest.raises(ValueError, match="decode_mask|inception_crop"):
        run("decode_mask|decode_jpeg_and_inception_crop(8)", raw)
    with pytest.raises(decode.DecodeError, match="segmentation map cannot be decoded"):
        run("decode|decode_mask", {**raw, "segmentation": b"not a png"})
