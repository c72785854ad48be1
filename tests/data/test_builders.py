"""Builders: digits, image folders and ImageNet-21k (from generated archives in the official layout)."""

import collections
import io
import json
import shutil
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_jax.data import datasets, imagenet21k, staging
from vit_jax.data.decode import sanitize_image


@pytest.fixture
def deleted_staging(monkeypatch):
    """What each staging folder held when prepare_builder deleted it: {"path", "sizes": {file: bytes}, "tars"}."""
    seen = []

    def members(tar_path):
        with tarfile.open(tar_path) as tar:
            return tar.getnames()

    def rmtree(path):
        path = Path(path)
        seen.append({"path": path, "sizes": {p.name: p.stat().st_size for p in path.iterdir()},
                     "tars": {p.name: members(p) for p in path.glob("*.tar")}})
        shutil.rmtree(path)

    monkeypatch.setattr(datasets, "shutil", types.SimpleNamespace(rmtree=rmtree))
    return seen


def labels_of(ds, split):
    src = ds.source(split)
    return [src[i]["label"] for i in range(len(src))]


def test_digits_counts_split_and_images(digits_ds):
    assert digits_ds.num_examples("train") == 1437 and digits_ds.num_examples("test") == 360
    assert digits_ds.num_classes == 10 and digits_ds.class_names == [str(d) for d in range(10)]
    test_counts = collections.Counter(labels_of(digits_ds, "test"))
    assert sum(test_counts.values()) == 360 and min(test_counts.values()) >= 35  # stratified: ~36 per digit
    ex = digits_ds.source("train")[0]
    img = Image.open(io.BytesIO(ex["image"]))
    assert img.format == "PNG" and img.size == (32, 32) and img.mode == "RGB"
    desc = digits_ds.description()
    assert desc["format"] == "array_record" and desc["splits"] == {"test": 360, "train": 1437}
    assert json.loads(json.dumps(desc)) == desc
    ids = {digits_ds.source(s)[i]["id"] for s in ("train", "test") for i in range(digits_ds.num_examples(s))}
    assert len(ids) == 1797  # disjoint splits covering every digit


def test_an_image_folder_too_small_for_a_hash_split_is_a_clear_error(tmp_path, gen):
    root = tmp_path / "few"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "0.jpg").write_bytes(gen.encode(gen.photo(20, 24)))  # one image: one split stays empty
    with pytest.raises(ValueError, match=r"its 1 usable images leave the '(train|test)' split .* empty"):
        datasets.open_dataset(f"folder:{root}", data_dir=str(tmp_path / "tfds"))


def test_image_folder_with_hash_split_and_bad_files(tmp_path, gen, deleted_staging):
    root = tmp_path / "pets"
    for c, cls in enumerate(["cat", "dog", "eel"]):
        (root / cls).mkdir(parents=True)
        for k in range(12):
            (root / cls / f"{k}.jpg").write_bytes(gen.encode(gen.photo(20, 24, seed=c * 100 + k)))
    (root / "dog" / "not_a_jpeg.JPEG").write_bytes(gen.bad_images()["converted_png"])
    (root / "eel" / "broken.jpg").write_bytes(gen.bad_images()["skipped_truncated"])
    (root / "eel" / "notes.txt").write_text("ignored: not an image suffix")
    ds = datasets.open_dataset(f"folder:{root}", data_dir=str(tmp_path / "tfds"))
    assert ds.class_names == ["cat", "dog", "eel"] and ds.splits == ["test", "train"]
    assert ds.num_examples("train") + ds.num_examples("test") == 12 * 3 + 1
    assert 0 < ds.num_examples("test") < 20
    report = json.loads((Path(ds.builder.data_dir) / "build_report.json").read_text())
    assert report["counts"] == {"kept": 36, "converted_png": 1, "skipped_truncated": 1}
    assert report["files"]["skipped_truncated"] == ["eel/eel/broken.jpg"]
    train_ids = {ds.source("train")[i]["id"].decode() for i in range(ds.num_examples("train"))}
    test_ids = {ds.source("test")[i]["id"].decode() for i in range(ds.num_examples("test"))}
    assert not train_ids & test_ids and "dog/not_a_jpeg.JPEG" in train_ids | test_ids
    # The JPEGs were read from the folder again, byte for byte; staging held only the converted PNG, and is gone.
    stored = {ex["id"].decode(): ex["image"] for split in ("train", "test")
              for ex in (ds.source(split)[i] for i in range(ds.num_examples(split)))}
    assert all(stored[f"{c}/{k}.jpg"] == (root / c / f"{k}.jpg").read_bytes() for c in ("cat", "dog", "eel")
               for k in range(12))
    assert stored["dog/not_a_jpeg.JPEG"] == sanitize_image(gen.bad_images()["converted_png"])[0]
    [staged] = deleted_staging
    assert staged["tars"] == {"dog.tar": ["dog/not_a_jpeg.JPEG"]} and sorted(staged["sizes"]) == [
        "cat.json", "dog.json", "dog.tar", "eel.json"]
    assert report["staging_bytes"] == sum(staged["sizes"].values())
    assert report["staging_deleted"] == str(staged["path"]) and not staged["path"].exists()


def test_image_folder_with_split_folders_and_tfrecord_format(tmp_path, gen):
    root = tmp_path / "tree"
    sizes = {"train": 5, "val": 2}
    for split, n in sizes.items():
        for c, cls in enumerate(["a", "b"]):
            (root / split / cls).mkdir(parents=True)
            for k in range(n):
                (root / split / cls / f"{k}.png").write_bytes(gen.encode(gen.photo(16, 16, c * 10 + k), fmt="PNG"))
    name, data_dir = f"folder:{root}", str(tmp_path / "tfds")
    # Prepared as TFRecord (how most existing TFDS copies are stored), then read through the same API.
    datasets.prepare_builder(datasets.make_builder(name, data_dir, file_format="tfrecord"), name)
    ds = datasets.open_dataset(name, data_dir=data_dir, prepare=False)
    assert ds.file_format == "tfrecord" and ds.splits == ["train", "val"]
    assert ds.num_examples("train") == 10 and ds.num_examples("val") == 4
    assert sorted(labels_of(ds, "val")) == [0, 0, 1, 1]
    ex = ds.source("val")[3]
    assert Image.open(io.BytesIO(ex["image"])).size == (16, 16) and ex["labels"] == [ex["label"]]


def make_release(tmp_path, gen, release: str, synsets: dict, form: str) -> Path:
    manual = tmp_path / "manual"
    manual.mkdir(exist_ok=True)
    tars = {f"{s}.tar": gen.synset_tar_bytes(files) for s, files in synsets.items()}
    archive = imagenet21k.ARCHIVES[release]
    if form == "outer":
        gen.write_tar(manual / archive, tars, mode="w:gz" if archive.endswith(".gz") else "w:")
    else:
        folder = manual / archive.split(".")[0]
        folder.mkdir()
        for name, data in tars.items():
            (folder / name).write_bytes(data)
    return manual


def test_imagenet21k_fall11_from_outer_tar(tmp_path, gen):
    synsets = imagenet21k.fall11_synsets()
    chosen = [synsets[i] for i in (0, 5, 21842)]
    files = {s: gen.imagenet_synsets(1, 8, seed=i, synsets=[s])[s] for i, s in enumerate(chosen)}
    files[chosen[1]].update({f"{chosen[1]}_{k}.JPEG": data for k, data in gen.bad_images().items()})
    manual = make_release(tmp_path, gen, "fall11", files, "outer")
    ds = datasets.open_dataset("imagenet21k", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))
    assert ds.num_classes == 21843 and ds.class_names[0] == "organism"
    # 8 good + 3 converted per the bad synset; holdout 50 per class, capped at half the synset.
    assert ds.num_examples("validation") == 4 + 5 + 4
    assert ds.num_examples("train") == 4 + 6 + 4
    counts = collections.Counter(labels_of(ds, "train") + labels_of(ds, "validation"))
    assert counts == {0: 8, 5: 11, 21842: 8}
    report = json.loads((Path(ds.builder.data_dir) / "build_report.json").read_text())
    assert report["counts"] == {"kept": 24, "converted_cmyk": 1, "converted_grayscale": 1, "converted_png": 1,
                                "skipped_corrupt": 1, "skipped_truncated": 1, "skipped_tiny": 1}
    # Every stored image: the archive's original bytes (re-read from it, not re-encoded) or the one conversion.
    stored = {ex["id"].decode(): ex["image"] for split in ("train", "validation")
              for ex in (ds.source(split)[i] for i in range(ds.num_examples(split)))}
    originals = {f"{s}/{name}": data for s, by_name in files.items() for name, data in by_name.items()}
    assert len(stored) == 27 and sum(stored[i] == originals[i] for i in stored) == 24
    assert all(stored[i] == sanitize_image(originals[i])[0] for i in stored)
    held = imagenet21k.holdout(sorted(files[chosen[2]]), 50)
    val_ids = {ds.source("validation")[i]["id"].decode() for i in range(ds.num_examples("validation"))}
    assert {f"{chosen[2]}/{n}" for n in held} <= val_ids


def test_imagenet21k_archive_links_and_escaping_names_are_counted_not_stored(tmp_path, gen):
    synset = imagenet21k.fall11_synsets()[7]
    good = gen.imagenet_synsets(1, 6, synsets=[synset])[synset]
    buf = io.BytesIO(gen.synset_tar_bytes(good))
    with tarfile.open(fileobj=buf, mode="a:") as tar:  # the regular files, then the members that are not
        first = next(iter(good))
        for name, kind in ((f"{synset}_sym.JPEG", tarfile.SYMTYPE), (f"{synset}_hard.JPEG", tarfile.LNKTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, first
            tar.addfile(info)
        for name in ("../escape.JPEG", "/abs/escape.JPEG"):  # would land outside the folder if extracted
            info = tarfile.TarInfo(name)
            info.size = len(good[first])
            tar.addfile(info, io.BytesIO(good[first]))
        fifo = tarfile.TarInfo(f"{synset}_pipe.JPEG")
        fifo.type = tarfile.FIFOTYPE
        tar.addfile(fifo)
    manual = tmp_path / "manual"
    manual.mkdir()
    gen.write_tar(manual / imagenet21k.ARCHIVES["fall11"], {f"{synset}.tar": buf.getvalue()})
    ds = datasets.open_dataset("imagenet21k", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))
    assert ds.num_examples("train") + ds.num_examples("validation") == 6
    report = json.loads((Path(ds.builder.data_dir) / "build_report.json").read_text())
    assert report["counts"] == {"kept": 6, "skipped_symlink": 1, "skipped_hardlink": 1, "skipped_unsafe_path": 2,
                                "skipped_not_a_file": 1}
    assert report["files"]["skipped_unsafe_path"] == [f"{synset}/escape.JPEG", f"{synset}/escape.JPEG"]


def test_imagenet21k_staging_holds_no_train_jpeg_bytes(tmp_path, gen, deleted_staging):
    synsets = imagenet21k.fall11_synsets()[:3]
    files = {s: {f"{s}_{k}.JPEG": gen.encode(gen.photo(128, 160, seed=i * 100 + k)) for k in range(60)}
             for i, s in enumerate(synsets)}
    manual = make_release(tmp_path, gen, "fall11", files, "outer")
    ds = datasets.open_dataset("imagenet21k/fall11_holdout2", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))
    assert ds.num_examples("train") == 3 * 58 and ds.num_examples("validation") == 3 * 2
    # Ordinary RGB JPEGs: staging held the names and the 2 held-out images per synset, nothing of the train split.
    [staged] = deleted_staging
    assert staged["path"].name == "imagenet21k_fall11_holdout2_staging" and not staged["path"].exists()
    assert staged["tars"] == {f"{s}.tar": [n for n in files[s] if n in imagenet21k.holdout(list(files[s]), 2)]
                              for s in synsets}
    # 2 of 60 images (3%), tar padding (10 KiB records) and the json: well below the archive's size.
    assert sum(staged["sizes"].values()) < (manual / "fall11_whole.tar").stat().st_size / 10
    report = json.loads((Path(ds.builder.data_dir) / "build_report.json").read_text())
    assert report["staging_bytes"] == sum(staged["sizes"].values()) and report["counts"] == {"kept": 180}


@pytest.mark.parametrize("form", ["folder", "outer"])  # a folder of tars, or winter21_whole.tar.gz (streamed twice)
def test_imagenet21k_winter21_from_folder_of_tars_or_tar_gz(tmp_path, gen, form):
    names = ["n09999999", "n00000002", "n01440764"]
    files = gen.imagenet_synsets(3, 6, seed=3, synsets=names)
    manual = make_release(tmp_path, gen, "winter21", files, form)
    ds = datasets.open_dataset("imagenet21k/winter21_holdout2", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))
    assert ds.num_classes == 3 and ds.builder.info.features["label"].names == sorted(names)
    assert ds.num_examples("validation") == 6 and ds.num_examples("train") == 12
    assert (Path(ds.builder.data_dir) / "synsets.txt").read_text().split() == sorted(names)
    assert collections.Counter(labels_of(ds, "validation")) == {0: 2, 1: 2, 2: 2}


def test_imagenet21k_build_resumes_after_interruption(tmp_path, gen, monkeypatch):
    synsets = imagenet21k.fall11_synsets()[:4]
    files = gen.imagenet_synsets(4, 3, seed=9, synsets=synsets)
    manual = make_release(tmp_path, gen, "fall11", files, "outer")
    data_dir = str(tmp_path / "tfds")

    class Interrupted(Exception):
        pass

    real = staging.sanitize_image

    def failing(data, **kw):
        if data == files[synsets[2]][f"{synsets[2]}_1.JPEG"]:
            raise Interrupted
        return real(data, **kw)

    monkeypatch.setattr(staging, "sanitize_image", failing)
    with pytest.raises(Interrupted):
        datasets.open_dataset("imagenet21k", data_dir=data_dir, manual_dir=str(manual), num_workers=1)
    staging_dir = Path(data_dir) / "downloads" / "imagenet21k_fall11_staging"
    assert sorted(p.name for p in staging_dir.glob("*.json")) == [f"{synsets[0]}.json", f"{synsets[1]}.json"]

    monkeypatch.setattr(staging, "sanitize_image", real)
    calls = []
    monkeypatch.setattr(staging, "sanitize_image", lambda data, **kw: calls.append(data) or real(data, **kw))
    ds = datasets.open_dataset("imagenet21k", data_dir=data_dir, manual_dir=str(manual))
    assert len(calls) == 2 * 3  # only the two unfinished synsets were read again
    report = json.loads((Path(ds.builder.data_dir) / "build_report.json").read_text())
    assert report["resumed_units"] == 2 and report["counts"] == {"kept": 12}
    assert ds.num_examples("train") + ds.num_examples("validation") == 12
    assert not staging_dir.exists() and report["staging_deleted"] == str(staging_dir)


def test_staging_keeps_names_and_converted_bytes_and_rereads_the_rest(tmp_path, gen):
    good = {f"{k}.jpg": gen.encode(gen.photo(40, 48, seed=k)) for k in range(4)}
    bad = gen.bad_images()
    files = {"0.jpg": good["0.jpg"], "gray.jpg": bad["converted_grayscale"], "broken.jpg": bad["skipped_truncated"],
             **good}
    reads = []

    def source(files=files):  # counts the files whose bytes are read
        return ((name, lambda name=name, data=data: reads.append(name) or data) for name, data in files.items())

    staged = staging.stage_units([("u", source)], tmp_path / "staging", workers=1)
    assert staged.file_names("u") == ["0.jpg", "gray.jpg", "1.jpg", "2.jpg", "3.jpg"]
    with tarfile.open(tmp_path / "staging" / "u.tar") as tar:
        assert tar.getnames() == ["gray.jpg"]
    reads.clear()
    converted = sanitize_image(bad["converted_grayscale"])[0]
    assert list(staged.files("u", source, only={"gray.jpg", "2.jpg"})) == [("gray.jpg", converted),
                                                                           ("2.jpg", good["2.jpg"])]
    assert reads == ["2.jpg"]  # skipped, dropped and staged files are never read from the source
    assert list(staged.files("u", None, only={"gray.jpg"})) == [("gray.jpg", converted)]  # source not needed
    changed = {**files, "3.jpg": good["3.jpg"] + b"\0"}
    with pytest.raises(staging.SourceChangedError, match=r"u/3\.jpg .*delete .*staging and prepare again"):
        list(staged.files("u", lambda: source(changed)))


def test_manual_dir_may_name_the_archive_its_folder_or_the_synset_tars(tmp_path, gen):
    manual = make_release(tmp_path, gen, "fall11", gen.imagenet_synsets(1, 2, synsets=["n00004475"]), "outer")
    archive = manual / "fall11_whole.tar"
    assert imagenet21k.find_release(archive, "fall11") == archive  # the README's --manual-dir /data/fall11_whole.tar
    assert imagenet21k.find_release(manual, "fall11") == archive
    tars = tmp_path / "tars"
    tars.mkdir()
    (tars / "n00004475.tar").write_bytes(gen.synset_tar_bytes({"n00004475_0.JPEG": gen.encode(gen.photo(9, 9))}))
    assert imagenet21k.find_release(tars, "fall11") == tars
    with pytest.raises(FileNotFoundError, match="winter21_whole.tar.gz"):
        imagenet21k.find_release(manual, "winter21")


def test_url_image_folder_is_refused_clearly(monkeypatch):
    # Image folders are read through pathlib: nothing may reach the network, no builder is even made. (A bucket
    # *data_dir* is supported: tests/storage/.)
    monkeypatch.setattr(datasets, "make_builder", lambda *a, **k: pytest.fail("make_builder called for a URL"))
    with pytest.raises(datasets.DataNotFoundError) as e:
        datasets.open_dataset("folder:gs://bucket/photos", data_dir="/tmp/tfds")
    message = str(e.value)
    assert message.startswith("image folder gs://bucket/photos:") and "\n" not in message
    assert "local disk only" in message and "gcloud storage cp -r" in message
    assert datasets.is_url("s3://b/x") and not datasets.is_url("/data/gs:/x") and not datasets.is_url("rel/dir")


def test_missing_data_errors_name_the_expected_files(tmp_path):
    with pytest.raises(datasets.DataNotFoundError, match=r"fall11_whole\.tar.*--manual-dir"):
        datasets.open_dataset("imagenet21k", data_dir=str(tmp_path), manual_dir=str(tmp_path / "nothing"))
    with pytest.raises(datasets.DataNotFoundError, match=r"ILSVRC2012_img_train\.tar, ILSVRC2012_img_val\.tar"):
        datasets.open_dataset("imagenet2012", data_dir=str(tmp_path))
    with pytest.raises(datasets.DataNotFoundError, match=r"cifar10 is not prepared.*--download"):
        datasets.open_dataset("cifar10", data_dir=str(tmp_path))
    with pytest.raises(datasets.DataNotFoundError, match="prepare-data digits"):
        datasets.open_dataset("digits", data_dir=str(tmp_path), prepare=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        datasets.open_dataset(f"folder:{tmp_path / 'nope'}", data_dir=str(tmp_path))


def test_prepared_standard_tfds_dataset_is_read_through_tfds_builder(tmp_path, digits_ds):
    # A dataset prepared by any TFDS builder is opened by name from its data_dir, without our builder classes.
    import shutil

    target = tmp_path / "other_ds" / "1.0.0"
    shutil.copytree(digits_ds.builder.data_dir, target)
    info = json.loads((target / "dataset_info.json").read_text())
    info["name"] = "other_ds"
    (target / "dataset_info.json").write_text(json.dumps(info))
    for f in target.glob("digits-*"):
        f.rename(target / f.name.replace("digits-", "other_ds-"))
    ds = datasets.open_dataset("other_ds", data_dir=str(tmp_path), prepare=False)
    assert ds.num_examples("test") == 360 and ds.num_classes == 10
    assert np.asarray(Image.open(io.BytesIO(ds.source("test")[0]["image"]))).shape == (32, 32, 3)


def test_flat_parser_returns_exactly_what_tfds_returns(digits_ds, gen):
    import tensorflow_datasets as tfds

    from vit_jax.data import features, sources

    src = digits_ds.source("train")
    assert src._parse is not None and src._parse.__name__ == "parser"  # the fast path is in use

    def same(a, b):
        assert type(a) is type(b) and a.keys() == b.keys()
        for key in a:
            assert type(a[key]) is type(b[key]) and a[key] == b[key], key
            if isinstance(a[key], list):
                assert [type(v) for v in a[key]] == [type(v) for v in b[key]], key

    def tfds_parse(feats, raw):
        decoders = {k: tfds.decode.SkipDecoding() for k, f in feats.items() if isinstance(f, tfds.features.Image)}
        return feats.deserialize_example_np(raw, decoders=decoders)

    for i in range(0, len(src), 97):
        raw = src._records[i]
        same(src[i], tfds_parse(src._features, raw))
    # Several labels, no label, non-ASCII ids: serialized by TFDS itself.
    feats = features.image_features(["a", "b", "c"])
    jpeg = gen.encode(gen.photo(8, 8))
    for labels, file_id in (([2, 0, 1], "n0/ä.JPEG"), ([], "x"), ([1], "")):
        raw = feats.serialize_example({"image": jpeg, "label": labels[0] if labels else 0, "labels": labels,
                                       "id": file_id})
        same(sources._flat_parser(feats)(raw), tfds_parse(feats, raw))
    # Anything else is left to TFDS.
    assert sources._flat_parser(tfds.features.FeaturesDict({"x": tfds.features.Tensor(shape=(2,), dtype=np.float32)})) is None


def test_an_unknown_tfds_name_is_refused_without_searching_the_community_index(tmp_path, caplog):
    """TFDS looks a name it does not know up in the community-dataset index (public buckets): on a host without
    internet that logged ~1,500 lines of retries before the one-line error. The name is checked against the
    registered builders first; namespaced community names still go to TFDS."""
    from vit_jax.data.datasets import DataNotFoundError, _community_name, make_builder

    with pytest.raises(DataNotFoundError, match=r"unknown dataset 'cifar1O': did you mean 'cifar10'\?"):
        make_builder("cifar1O", str(tmp_path))
    assert not [r for r in caplog.records if "googleapis" in r.getMessage() or "bucket" in r.getMessage()]
    assert make_builder("cifar10:3.0.2", str(tmp_path)).name == "cifar10"  # a version, not a namespace
    assert [_community_name(n) for n in ("huggingface:mnist", "mnist:3.0.1", "cifar10/plain:3.*.*", "mnist")] == [
        True, False, False, False]


def test_making_a_builder_before_its_data_is_prepared_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """TFDS makes (and never removes) a temporary folder to look for a builder's info in gs://tfds-data whenever a
    builder is made before its data is prepared; vit_jax's builders have nothing there and skip the lookup."""
    import tempfile

    from vit_jax.data.datasets import make_builder

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    (tmp_path / "images" / "a").mkdir(parents=True)
    builders = [make_builder(name, str(tmp_path / "data")) for name in
                ("digits", "digits_mosaic", "moving_digits", "imagenet21k", f"folder:{tmp_path / 'images'}")]
    assert [b.info.name for b in builders] and not list(temp.iterdir())
