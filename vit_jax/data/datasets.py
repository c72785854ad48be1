"""Dataset names -> prepared TFDS datasets: `open_dataset` and the `Dataset` handle the pipeline reads from.

Names: "digits", "digits_mosaic", "moving_digits" (clips), "imagenet21k" (= "imagenet21k/fall11"),
"imagenet21k/winter21", "folder:/abs/path", or any TFDS name ("cifar10", "imagenet2012", "oxford_iiit_pet:3.*.*" ...).
Nothing touches the network unless `download=True`, or the data_dir is a bucket (gs://...): then a dataset is read from there (streamed by the
pipeline, see stream_plan.py), and one that is not there yet is built in a local staging folder and uploaded.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from functools import cached_property
from pathlib import Path

from vit_jax.data.sources import RecordSource
from vit_jax.errors import UserError, debug_enabled, one_line
from vit_jax.storage import remote

# Manual files of the standard datasets we name in errors (TFDS's own instructions are long).
KNOWN_MANUAL_FILES = {"imagenet2012": ["ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"]}
BUILD_REPORT = "build_report.json"
GENERATED = ("digits", "digits_mosaic", "moving_digits")  # built from data shipped with scikit-learn: no download


class DataNotFoundError(UserError, FileNotFoundError):
    """The dataset is neither prepared nor preparable from local files."""


def default_data_dir() -> str:
    return os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


is_url = remote.is_url
INFO_FILES = ("features.json", "dataset_info.json")  # TFDS reads these to open a dataset: uploaded last, in order


def default_staging_dir(url: str) -> str:
    """Where a dataset for a bucket is built before upload: $VIT_JAX_STAGING_DIR or ~/.cache/vit_jax/staging/..."""
    root = os.environ.get("VIT_JAX_STAGING_DIR") or os.path.expanduser("~/.cache/vit_jax/staging")
    return os.path.join(root, re.sub(r"[^A-Za-z0-9_.-]+", "_", url))


def _check_local(path: str, what: str) -> None:
    # Image folders are read through pathlib: a URL is refused up front, saying what works, before anything
    # touches the network (or os.path.abspath turns it into /cwd/gs:/...).
    if is_url(path):
        raise DataNotFoundError(f"{what} {path}: image folders are read from local disk only; copy it to a local "
                                f"folder (e.g. `gcloud storage cp -r {path} /data/`) and pass that (the prepared "
                                f"dataset may then go to a bucket with --data-dir gs://...)")


def _import_tfds():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow_datasets as tfds

    return tfds


def _base_name(name: str) -> str:
    """"cifar10/plain:3.0.2" -> "cifar10" (TFDS's name[/config][:version])."""
    return name.split("/")[0].split(":")[0]


def _community_name(name: str) -> bool:
    """"huggingface:mnist": TFDS's namespace:dataset form of a community dataset (resolved over the network), as
    opposed to "mnist:3.0.1" (a version)."""
    head, sep, tail = name.split("/")[0].partition(":")
    return bool(sep) and not re.fullmatch(r"[\d*]+(\.[\d*]+)*", tail)


def _prepared_in(data_dir: str, name: str) -> bool:
    """Whether data_dir holds a dataset of this name prepared by some TFDS builder (which tfds.builder then reads
    from its files, without the builder's class)."""
    path = f"{data_dir}/{_base_name(name)}"
    return remote.exists(path) if is_url(data_dir) else os.path.isdir(path)


def make_builder(name: str, data_dir: str, file_format: str | None = None):
    """The TFDS builder for a dataset name (our builders or TFDS's); nothing is read or prepared yet.

    file_format is for preparing only ("array_record" or "tfrecord"); readers take it from the prepared info.
    """
    tfds = _import_tfds()
    if name == "digits":
        from vit_jax.data.digits import Digits

        return Digits(data_dir=data_dir, file_format=file_format)
    if name == "digits_mosaic":
        from vit_jax.data.digits_mosaic import DigitsMosaic

        return DigitsMosaic(data_dir=data_dir, file_format=file_format)
    if name == "moving_digits":
        from vit_jax.data.moving_digits import MovingDigits

        return MovingDigits(data_dir=data_dir, file_format=file_format)
    if name.startswith("folder:"):
        from vit_jax.data.image_folder import ImageFolder

        return ImageFolder(root=name[len("folder:"):], data_dir=data_dir, file_format=file_format)
    if name == "imagenet21k" or name.startswith("imagenet21k/"):
        from vit_jax.data import imagenet21k

        config = imagenet21k.parse_config_name(name.partition("/")[2] or "fall11")
        if config.holdout_per_class == imagenet21k.DEFAULT_HOLDOUT:
            config = config.name  # TFDS insists on its own instance for the configs the class lists
        return imagenet21k.Imagenet21k(config=config, data_dir=data_dir, file_format=file_format)
    registered = tfds.list_builders(with_community_datasets=False)
    try:
        if not (_community_name(name) or _base_name(name) in registered or _prepared_in(data_dir, name)):
            # Refused here, not by tfds.builder: for a name it knows neither as a builder nor as files in data_dir,
            # TFDS searches the community-dataset index in public buckets, which logs hundreds of lines (and waits on
            # retries) on a host without internet access.
            raise tfds.core.registered.DatasetNotFoundError(name)
        return tfds.builder(name, data_dir=data_dir, file_format=file_format)
    except tfds.core.registered.DatasetNotFoundError as e:
        import difflib

        close = difflib.get_close_matches(_base_name(name), [*GENERATED, "imagenet21k", *registered], n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise DataNotFoundError(f"unknown dataset '{name}': {hint}use digits, digits_mosaic, moving_digits, "
                                "imagenet21k[/fall11|/winter21], "
                                "folder:/path or a TFDS name (tfds.list_builders())") from e
    except Exception as e:  # noqa: BLE001 - TFDS raises several types for missing versions, bad configs
        raise DataNotFoundError(f"cannot open dataset '{name}' in {data_dir}: {one_line(e)}") from e


def _manual_dir_problem(name: str, builder, manual_dir: str) -> str | None:
    """Why `builder` cannot be prepared from manual_dir, or None if it can (or needs no manual files)."""
    if name.startswith("imagenet21k"):
        from vit_jax.data import imagenet21k

        try:
            imagenet21k.find_release(manual_dir, builder.builder_config.release)
        except FileNotFoundError as e:
            return str(e)
        return None
    if not getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None):
        return None
    expected = KNOWN_MANUAL_FILES.get(builder.name)
    if expected:
        missing = [f for f in expected if not (Path(manual_dir) / f).exists()]
        return f"{builder.name}: expected {', '.join(missing)} in manual_dir {manual_dir}" if missing else None
    if not Path(manual_dir).is_dir() or not any(Path(manual_dir).iterdir()):
        return f"{builder.name}: its manual files must be placed in {manual_dir} (see the TFDS catalog page)"
    return None


def prepare_builder(builder, name: str, manual_dir: str | None = None, download: bool = False,
            num_workers: int | None = None, show: bool = True) -> dict | None:
    """Builds the dataset files; writes and (if `show`) prints the build report. Raises DataNotFoundError if
    impossible. `show=False` also keeps TFDS's own build output (notices, progress bars) off the console."""
    tfds = _import_tfds()
    manual_dir = manual_dir or os.path.join(builder.data_dir_root, "downloads", "manual")
    problem = _manual_dir_problem(name, builder, manual_dir)
    if problem:
        raise DataNotFoundError(problem)
    local_only = name in GENERATED or name.startswith(("folder:", "imagenet21k")) or bool(
        getattr(builder, "MANUAL_DOWNLOAD_INSTRUCTIONS", None))
    if not (local_only or download):
        raise DataNotFoundError(f"{name} is not prepared in {builder.data_dir_root}: copy its prepared files there, "
                                f"or run `vit-jax prepare-data {name} --download` (needs network)")
    if num_workers is not None:
        builder.num_workers = num_workers
    if Path(manual_dir).is_file():  # an archive named directly (imagenet21k): TFDS's manual_dir must be a folder
        builder.manual_file = Path(manual_dir)
        manual_dir = str(Path(manual_dir).parent)
    config = tfds.download.DownloadConfig(manual_dir=manual_dir, try_download_gcs=False)
    if show:
        builder.download_and_prepare(download_config=config)
    else:
        with _tfds_quiet(tfds):
            builder.download_and_prepare(download_config=config)
    report = getattr(builder, "build_report", None)
    if report is None:
        return None
    out_dir = Path(builder.data_dir)
    extra = {"dataset": name, **(getattr(builder, "report_extra", None) or {})}
    staging_dir = getattr(builder, "staging_dir", None)
    if staging_dir is not None and Path(staging_dir).exists():
        # The build is complete, so its resume state is no longer needed (and holds converted/held-out images).
        shutil.rmtree(staging_dir)
        extra["staging_deleted"] = str(staging_dir)
    report.write(out_dir / BUILD_REPORT, extra)
    if hasattr(builder, "write_extra_files"):
        builder.write_extra_files(out_dir)
    if show:
        print(f"build report ({out_dir / BUILD_REPORT}): {report.summary()}")
    if show and "staging_deleted" in extra:
        print(f"deleted the build's staging folder {staging_dir} ({extra.get('staging_bytes', 0) / 2**20:.1f} MiB)")
    return {**extra, **report.to_dict()}


@contextlib.contextmanager
def _tfds_quiet(tfds):
    """TFDS's build output off the console: its notices (printed to stdout by design), progress bars and log
    warnings below ERROR. VIT_JAX_DEBUG (`--verbose`) keeps them."""
    if debug_enabled():
        yield
        return
    import logging

    from tensorflow_datasets.core.utils import tqdm_utils

    def below_error_from_tfds(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or "tensorflow_datasets" not in record.pathname

    bars = getattr(tqdm_utils, "_active", True)
    tfds.display_progress_bar(False)
    absl_logger = logging.getLogger("absl")
    absl_logger.addFilter(below_error_from_tfds)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        absl_logger.removeFilter(below_error_from_tfds)
        tfds.display_progress_bar(bars)


class Dataset:
    """A prepared dataset: sizes, classes, a JSON description, and random-access sources per split.

    A split is any TFDS split spec: `train`, `train[:10%]`, `train[99%:]`, `train[:1000]`, `train[10%:20%]`,
    `train+validation` (exact counts, resolved by TFDS to file slices; see sources.py).
    """

    def __init__(self, name: str, builder) -> None:
        self.name = name
        self.builder = builder
        self.remote = is_url(str(builder.data_dir))  # in a bucket: the pipeline streams it
        self._sources: dict[str, RecordSource] = {}

    @property
    def splits(self) -> list[str]:
        return sorted(self.builder.info.splits.keys())

    def _check_split(self, split: str) -> None:
        from vit_jax.data.sources import split_slices

        split_slices(self.builder.info, split)  # ValueError naming the splits if the spec is not valid

    def num_examples(self, split: str) -> int:
        self._check_split(split)
        return int(self.builder.info.splits[split].num_examples)

    @property
    def _label_feature(self):
        feats = self.builder.info.features
        return feats["label"] if "label" in feats else None

    @property
    def num_classes(self) -> int:
        label = self._label_feature
        return int(label.num_classes) if label is not None and getattr(label, "num_classes", None) else 0

    @cached_property
    def class_names(self) -> list[str]:
        """Human-readable class names (WordNet synsets become their first lemma)."""
        label = self._label_feature
        names = list(label.names) if label is not None and getattr(label, "names", None) else []
        if names and all(re.fullmatch(r"n\d{8}", n) for n in names):
            from vit_jax.data.imagenet21k import RESOURCES

            lemmas = dict(line.split("\t", 1) for line in
                          (RESOURCES / "imagenet_synset_to_lemma.txt").read_text().splitlines() if "\t" in line)
            names = [lemmas.get(n, n).split(",")[0].strip() for n in names]
        return names

    @property
    def file_format(self) -> str:
        fmt = self.builder.info.file_format
        return getattr(fmt, "value", str(fmt or "tfrecord"))

    def description(self) -> dict:
        """JSON-able summary: name, version, split sizes, classes, data_dir, format (and the build report)."""
        out = {"name": self.name, "version": str(self.builder.info.version),
               "splits": {s: self.num_examples(s) for s in self.splits}, "num_classes": self.num_classes,
               "data_dir": str(self.builder.data_dir), "format": self.file_format}
        if self._build_report is not None:
            out["build_report"] = self._build_report
        return out

    @cached_property
    def _build_report(self) -> dict | None:
        """The build report's counts, read once (every checkpoint's metadata holds the description)."""
        report = f"{self.builder.data_dir}/{BUILD_REPORT}"
        data = (remote.read_bytes(report) if remote.exists(report) else None) if self.remote else (
            Path(report).read_bytes() if Path(report).exists() else None)
        return None if data is None else json.loads(data).get("counts", {})

    def spooled_records(self, split: str, max_files: int | None = None):
        """A fresh reader of a bucket split's records through a spool of its own (the caller closes it)."""
        from vit_jax.data.sources import file_format_name, split_slices
        from vit_jax.data.spool import SpooledRecords
        from vit_jax.data.stream_plan import FETCH_THREADS

        return SpooledRecords(split_slices(self.builder.info, split), file_format_name(self.builder.info),
                              parallel=FETCH_THREADS, max_files=max_files)

    def source(self, split: str, records=None) -> RecordSource:
        """Random access to the split's records (opened once and shared), or over `records` (not shared). In a
        bucket, whole files are fetched on demand and the two most recently used kept: sequential reading is fine,
        random access is not (the pipeline streams instead)."""
        if records is not None:
            return RecordSource(self.builder, split, records=records)
        self._check_split(split)
        if split not in self._sources:
            records = self.spooled_records(split, max_files=2) if self.remote else None
            self._sources[split] = RecordSource(self.builder, split, records=records)
        return self._sources[split]


def upload_prepared(local: Dataset, staging_dir: str, url: str, progress: bool = True) -> dict:
    """Copies a dataset built under `staging_dir` to the same place under `url`, file by file, skipping files
    uploaded before (same size: a rerun resumes) and writing features.json then dataset_info.json last: until then
    the dataset is not prepared for any reader (TFDS, and this module, check dataset_info.json first)."""
    version_dir = str(local.builder.data_dir)
    rel = os.path.relpath(version_dir, staging_dir)
    target = f"{url.rstrip('/')}/{rel}"
    counts = remote.upload_tree(version_dir, target, last=INFO_FILES, progress=progress)
    print(f"uploaded {local.name} to {target}: {counts['uploaded']} files ({counts['bytes'] / 2**20:.1f} MiB), "
          f"{counts['skipped']} already there")
    return counts


def _open_remote(name: str, url: str, manual_dir: str | None, prepare: bool, download: bool,
                 num_workers: int | None, show_build: bool = False) -> Dataset:
    remote.check_location(url, "data_dir")  # a missing or unreachable bucket: one line, before anything else
    builder = make_builder(name, url)
    # Checked directly: TFDS's is_prepared() uses fsspec's exists(), which answers False when the bucket fails.
    if remote.exists(f"{builder.data_dir}/dataset_info.json"):
        return Dataset(name, builder)
    if not prepare:
        raise DataNotFoundError(f"{name} is not prepared in {url}: run `vit-jax prepare-data {name} --data-dir {url}`")
    staging = default_staging_dir(url)
    local = open_dataset(name, staging, manual_dir=manual_dir, prepare=True, download=download,
                         num_workers=num_workers, show_build=show_build)
    upload_prepared(local, staging, url, progress=show_build)
    shutil.rmtree(staging, ignore_errors=True)
    return Dataset(name, make_builder(name, url))


def open_dataset(name: str, data_dir: str | None = None, manual_dir: str | None = None, prepare: bool = True,
                 download: bool = False, num_workers: int | None = None, show_build: bool = False) -> Dataset:
    """Opens a prepared dataset, building it first when possible (digits, folders, manual files) and allowed.

    data_dir=None means $TFDS_DATA_DIR or ~/tensorflow_datasets. `download=True` lets TFDS fetch data. A bucket
    data_dir (gs://...) is checked first (a missing bucket is a one-line StorageError); a dataset that is not
    there is built in default_staging_dir(data_dir) and uploaded (see upload_prepared).

    A build on first use says so in one line; TFDS's page of build output (notices, progress bars, warnings about
    the folder it is creating) is shown only by `show_build` (prepare-data, whose job the build is) or --verbose.
    """
    data_dir = data_dir or default_data_dir()
    if name.startswith("folder:"):
        _check_local(name[len("folder:"):], "image folder")
    if is_url(data_dir):
        return _open_remote(name, data_dir.rstrip("/"), manual_dir, prepare, download, num_workers, show_build)
    data_dir = os.path.abspath(os.path.expanduser(data_dir))
    tfds = _import_tfds()
    with contextlib.nullcontext() if show_build else _tfds_quiet(tfds):
        builder = make_builder(name, data_dir)
        prepared = builder.is_prepared()
    if not prepared:
        if not prepare:
            raise DataNotFoundError(f"{name} is not prepared in {data_dir}: run `vit-jax prepare-data {name} "
                                    f"--data-dir {data_dir}`")
        if not show_build:
            print(f"preparing dataset {name} in {data_dir} (on first use only; `vit-jax prepare-data {name}` shows "
                  "the build)", flush=True)
        with contextlib.nullcontext() if show_build else _tfds_quiet(tfds):
            builder = make_builder(name, data_dir, file_format="array_record")
            prepare_builder(builder, name, manual_dir=manual_dir, download=download, num_workers=num_workers,
                            show=show_build)
            builder = make_builder(name, data_dir)  # re-open read-only, with the info as written
    return Dataset(name, builder)
