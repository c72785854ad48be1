"""The one example format every vit_jax builder writes: image bytes, label, labels (multi-hot ready), id."""

from __future__ import annotations

import hashlib
from pathlib import Path

import tensorflow_datasets as tfds

from vit_jax.data.decode import BuildReport


def image_features(names: list[str] | None = None, encoding: str = "jpeg") -> tfds.features.FeaturesDict:
    """Features of vit_jax builders; `names=None` leaves the class list to be set once the source is scanned."""
    return tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(None, None, 3), encoding_format=encoding),
        "label": tfds.features.ClassLabel(names=names),
        "labels": tfds.features.Sequence(tfds.features.ClassLabel(names=names)),
        "id": tfds.features.Text(),
    })


class LocalDatasetInfo(tfds.core.DatasetInfo):
    """The DatasetInfo of vit_jax's builders (they download nothing, so gs://tfds-data holds no info of theirs).

    TFDS looks there whenever a builder is made before its data is prepared, and first makes a temporary folder
    that it never removes, even when the lookup is off (as it is by default): one empty folder left in /tmp per
    build (~1,100 after a day of test runs here). There is nothing to look up, so the lookup is skipped.
    """

    def initialize_from_bucket(self) -> None:
        pass


def set_class_names(info: tfds.core.DatasetInfo, names: list[str]) -> None:
    """Sets the class list of features built with names=None (both label features)."""
    info.features["label"].names = names
    info.features["labels"].feature.names = names


def example(image: bytes, label: int, file_id: str) -> dict:
    # Stored image bytes are passed through unchanged: TFDS does not re-encode bytes it is given.
    return {"image": image, "label": label, "labels": [label], "id": file_id}


def hash_key(name: str) -> str:
    """A stable, well-mixed hex key of a file name (for held-out splits that never depend on file order)."""
    return hashlib.sha256(name.encode()).hexdigest()


class LocalBuilderMixin:
    """Shared by vit_jax builders (list it before GeneratorBasedBuilder).

    Builders fill `build_report` while generating; datasets.prepare_builder writes it next to the data, and deletes
    `staging_dir` (resumable build state, see staging.py) once the build has succeeded. They download nothing, so
    they have no checksums file: TFDS would otherwise look for one beside the code, through a package-resources
    lookup that needs the importlib_resources backport.
    """

    build_report: BuildReport | None = None
    report_extra: dict | None = None
    staging_dir: Path | None = None
    code_path = None
    url_infos = None
