"""`folder:/abs/path`: a user's image tree prepared into the same TFDS format as every other dataset.

Layouts:
- `root/<split>/<class>/*.jpg|png|...` when root has a `train/` folder: each top-level folder is a split;
- `root/<class>/*.jpg|png|...` otherwise: a deterministic hash split, `test` gets files whose sha256(relative
  path) falls in the first TEST_PERCENT percent, `train` the rest.
Classes are the sorted union of class folder names. Images go through the same checks as ImageNet-21k (kept
as JPEG bytes, converted once, or skipped and counted in the build report). Staging is per (split, class)
folder, so an interrupted build resumes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import tensorflow_datasets as tfds

from vit_jax.data import features, staging
from vit_jax.errors import MissingInputError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
TEST_PERCENT = 20


@dataclasses.dataclass(eq=False)
class FolderConfig(tfds.core.BuilderConfig):
    root: str = ""
    min_side: int = 8


def config_for(root: str | os.PathLike) -> FolderConfig:
    """One config per folder: its name is the folder name plus a hash of the absolute path."""
    root = os.path.abspath(root)
    slug = "".join(c if c.isalnum() else "_" for c in os.path.basename(root.rstrip("/")))[:40] or "root"
    name = f"{slug}_{hashlib.sha256(root.encode()).hexdigest()[:8]}"
    return FolderConfig(name=name, version="1.0.0", root=root, description=f"images under {root}")


def scan(root: Path) -> tuple[dict[str, dict[str, list[Path]]], bool]:
    """{split or "": {class: [image paths]}} and whether the tree has split folders."""
    if not root.is_dir():
        raise MissingInputError(f"image folder {root} does not exist; pass folder:/abs/path/to/images")
    has_splits = (root / "train").is_dir()
    tops = sorted(p for p in root.iterdir() if p.is_dir())
    groups = {p.name: p for p in tops} if has_splits else {"": root}
    tree: dict[str, dict[str, list[Path]]] = {}
    for split, base in groups.items():
        tree[split] = {
            c.name: sorted(f for f in c.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
            for c in sorted(p for p in base.iterdir() if p.is_dir())
        }
    if not any(files for classes in tree.values() for files in classes.values()):
        raise MissingInputError(
            f"no images found under {root}; expected root/<class>/*.jpg or root/<split>/<class>/*.jpg")
    return tree, has_splits


def in_test_split(relative_path: str) -> bool:
    return int(features.hash_key(relative_path)[:8], 16) % 100 < TEST_PERCENT


class ImageFolder(features.LocalBuilderMixin, tfds.core.GeneratorBasedBuilder):
    """A folder of class sub-folders (see module docstring). Construct with ImageFolder(root=..., data_dir=...)."""

    name = "vit_image_folder"
    VERSION = tfds.core.Version("1.0.0")
    num_workers: int | None = None

    def __init__(self, *, root: str | os.PathLike, **kwargs) -> None:
        super().__init__(config=config_for(root), **kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return features.LocalDatasetInfo(builder=self, description=self.builder_config.description,
                                     features=features.image_features(None), supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
        root = Path(self.builder_config.root)
        tree, has_splits = scan(root)
        classes = sorted({c for split in tree.values() for c in split})
        features.set_class_names(self.info, classes)
        # A file's bytes are read only when a pass needs them (f.read_bytes is the reader staging.files calls).
        units = {(f"{split}/{cls}" if split else cls): lambda files=files: ((str(f.relative_to(root)), f.read_bytes)
                                                                          for f in files)
                 for split, by_class in tree.items() for cls, files in by_class.items()}
        self.staging_dir = Path(dl_manager.download_dir) / f"vit_image_folder_{self.builder_config.name}_staging"
        staged = staging.stage_units(units.items(), self.staging_dir, min_side=self.builder_config.min_side,
                                     workers=self.num_workers, total=len(units), desc=str(root))
        self.build_report = staged.report
        self.report_extra = {"root": str(root), "has_split_folders": has_splits, "num_classes": len(classes),
                             "resumed_units": staged.resumed, "staging_bytes": staged.disk_bytes()}
        label_of = {c: i for i, c in enumerate(classes)}
        if has_splits:
            return {split: self._generate_examples(staged, units, label_of,
                                                   [u for u in staged.names if u.startswith(split + "/")], None)
                    for split in tree}
        kept = [n for u in staged.names for n in staged.file_names(u)]
        for split in ("train", "test"):
            if not any(in_test_split(n) == (split == "test") for n in kept):
                # TFDS would stop with "No examples were yielded" after writing the other split.
                raise ValueError(f"image folder {root}: its {len(kept)} usable images leave the "
                                 f"'{split}' split ({TEST_PERCENT}% test by file-name hash) empty; add images, or "
                                 "give the splits as root/train/<class>/ and root/test/<class>/")
        return {split: self._generate_examples(staged, units, label_of, staged.names, split == "test")
                for split in ("train", "test")}

    def _generate_examples(self, staged: staging.StagedUnits, units: dict, label_of: dict[str, int],
                           unit_names: list[str], test: bool | None):
        # Only converted images come from staging; every other kept image is read from the folder again.
        for unit in unit_names:
            label = label_of[unit.rsplit("/", 1)[-1]]
            wanted = {n for n in staged.file_names(unit) if test is None or in_test_split(n) == test}
            for name, data in staged.files(unit, units[unit], only=wanted):
                yield name, features.example(data, label, name)
