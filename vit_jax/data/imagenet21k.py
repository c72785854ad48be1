"""`imagenet21k`: ImageNet-21k from the official release archives, streamed (never unpacked to disk).

Put one of these in the TFDS manual_dir (default <data_dir>/downloads/manual):
- fall 2011: `fall11_whole.tar`; winter 2021: `winter21_whole.tar.gz` -- an outer archive of per-synset tars
  (`n01440764.tar` holding `n01440764_10026.JPEG`, ...);
- or the per-synset tars in a folder `fall11_whole/` / `winter21_whole/` (or directly in manual_dir).

Labels: fall11 uses the 21,843-synset list of the official i21k checkpoints (shipped in vit_jax/resources; two
synsets have no images); winter21 uses the sorted synsets found in the archive (written as synsets.txt next to
the data). Split: per synset, the `holdout_per_class` files with the smallest sha256(file name) go to
`validation` (never more than half of a synset), the rest to `train`.

Building: staging (see staging.py) reads the archive once, checking every image and keeping on disk only the
kept file names, the converted images and the held-out validation images; writing the train split streams the
archive a second time for the original JPEG bytes. The staging folder is deleted after a successful build.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tarfile
from pathlib import Path
from typing import Iterator

import tensorflow_datasets as tfds

from vit_jax.data import features, staging
from vit_jax.errors import ConfigError
from vit_jax.resources import __file__ as _resources_init

RESOURCES = Path(_resources_init).parent / "imagenet"
ARCHIVES = {"fall11": "fall11_whole.tar", "winter21": "winter21_whole.tar.gz"}
DEFAULT_HOLDOUT = 50


def fall11_synsets() -> list[str]:
    """The 21,843 synsets of the official i21k checkpoints' heads (line index = class id)."""
    return (RESOURCES / "imagenet21k_goog_synsets.txt").read_text().split()


@dataclasses.dataclass(eq=False)
class Imagenet21kConfig(tfds.core.BuilderConfig):
    release: str = "fall11"
    holdout_per_class: int = DEFAULT_HOLDOUT
    min_side: int = 8  # images smaller than this (either side) are skipped as "tiny"


def make_config(release: str, holdout_per_class: int = DEFAULT_HOLDOUT) -> Imagenet21kConfig:
    """Config `fall11` / `winter21` (holdout 50), or e.g. `fall11_holdout10` for another held-out size."""
    if release not in ARCHIVES:
        raise ConfigError(f"unknown imagenet21k release '{release}'; choose one of {sorted(ARCHIVES)}")
    name = release if holdout_per_class == DEFAULT_HOLDOUT else f"{release}_holdout{holdout_per_class}"
    return Imagenet21kConfig(name=name, version="1.0.0", release=release, holdout_per_class=holdout_per_class,
                             description=f"ImageNet-21k {release} release, {holdout_per_class} validation images per class")


def parse_config_name(name: str) -> Imagenet21kConfig:
    m = re.fullmatch(r"(fall11|winter21)(?:_holdout(\d+))?", name)
    if not m:
        raise ConfigError(f"unknown imagenet21k config '{name}'; use fall11, winter21 or e.g. fall11_holdout10")
    return make_config(m.group(1), int(m.group(2) or DEFAULT_HOLDOUT))


def find_release(manual_dir: str | os.PathLike, release: str) -> Path:
    """The release archive or folder of per-synset tars; a one-line error naming both if absent.

    manual_dir may be the archive itself (`--manual-dir /data/fall11_whole.tar`, as the README has it), a folder
    holding it or the folder `fall11_whole/` / `winter21_whole/`, or a folder of the n*.tar files.
    """
    manual_dir = Path(manual_dir)
    archive = ARCHIVES[release]
    folder = archive.split(".")[0]
    if manual_dir.is_file():
        return manual_dir
    for candidate in (manual_dir / archive, manual_dir / folder):
        if candidate.exists():
            return candidate
    if manual_dir.is_dir() and any(manual_dir.glob("n*.tar")):
        return manual_dir
    raise FileNotFoundError(
        f"imagenet21k/{release}: expected {manual_dir / archive} or a folder {manual_dir / folder}/ of per-synset "
        f"n*.tar files; download the release from image-net.org and pass --manual-dir (the archive or its folder)")


def member_kind(member: tarfile.TarInfo) -> str | None:
    """None for a regular file we may read; else the report kind it is skipped and counted as (directories, which
    every tar may hold, are not counted)."""
    parts = member.name.replace("\\", "/").split("/")
    if member.name.startswith("/") or ".." in parts:
        return "skipped_unsafe_path"
    if member.issym():
        return "skipped_symlink"
    if member.islnk():
        return "skipped_hardlink"
    if member.isdir():
        return ""
    return None if member.isfile() else "skipped_not_a_file"


def _inner_files(**tar_source) -> staging.FileIter:
    # Streaming mode: the inner tar is read front to back, nothing is extracted to disk. A file's bytes are read
    # only if its reader is called (before the stream moves on); the others are skipped. Members that are not
    # regular files inside the synset's folder are never read, only counted (staging.NotAFile).
    with tarfile.open(mode="r|*", **tar_source) as inner:
        for member in inner:
            kind = member_kind(member)
            if kind is None:
                yield os.path.basename(member.name), lambda member=member: inner.extractfile(member).read()
            elif kind:
                yield os.path.basename(member.name) or member.name, staging.NotAFile(kind)


def synset_units(source: Path) -> Iterator[staging.Unit]:
    """(synset, files) for each per-synset tar of an outer archive (streamed) or a folder of tars.

    Each pass over the archive streams it again: staging reads it once, writing the train split once more.
    """
    if source.is_dir():
        for path in sorted(source.glob("n*.tar")):
            yield path.stem, lambda path=path: _inner_files(name=path)
        return
    with tarfile.open(source, mode="r|*") as outer:
        for member in outer:
            if member.isfile() and member.name.endswith(".tar"):
                # Must be read before the outer stream moves on (or not at all: the stream then skips it).
                fileobj = outer.extractfile(member)
                yield os.path.basename(member.name)[: -len(".tar")], lambda f=fileobj: _inner_files(fileobj=f)


def holdout(names: list[str], per_class: int) -> set[str]:
    """The held-out (validation) file names of one synset: the smallest sha256(name), at most half the synset."""
    count = min(per_class, len(names) // 2)
    return set(sorted(names, key=features.hash_key)[:count])


class Imagenet21k(features.LocalBuilderMixin, tfds.core.GeneratorBasedBuilder):
    """ImageNet-21k (fall11 or winter21) prepared from the official archives (see module docstring)."""

    name = "imagenet21k"
    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [make_config("fall11"), make_config("winter21")]
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Place fall11_whole.tar or winter21_whole.tar.gz (or a folder of n*.tar) in manual_dir."
    num_workers: int | None = None  # image-checking threads while staging (None: all cores)
    manual_file: Path | None = None  # the archive when --manual-dir names it (TFDS's manual_dir must be a folder)

    def _info(self) -> tfds.core.DatasetInfo:
        names = fall11_synsets() if self.builder_config.release == "fall11" else None
        return features.LocalDatasetInfo(builder=self, description=self.builder_config.description,
                                     features=features.image_features(names), supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
        cfg = self.builder_config
        source = find_release(self.manual_file or dl_manager.manual_dir, cfg.release)
        # Per holdout size: the held-out images are staged (see below), so another holdout needs its own staging.
        self.staging_dir = Path(dl_manager.download_dir) / f"imagenet21k_{cfg.name}_staging"
        staged = staging.stage_units(
            synset_units(source), self.staging_dir, min_side=cfg.min_side, workers=self.num_workers,
            total=len(list(source.glob("n*.tar"))) if source.is_dir() else None, desc=f"imagenet21k/{cfg.release}",
            # The validation images (at most holdout_per_class per synset, ~7% of fall11 at 50) are staged, so
            # the validation split is written without a third pass over the archive.
            keep_bytes=lambda synset, names: holdout(names, cfg.holdout_per_class))
        if cfg.release == "fall11":
            synsets = fall11_synsets()
        else:
            synsets = sorted(staged.names)
            features.set_class_names(self.info, synsets)
        label_of = {s: i for i, s in enumerate(synsets)}
        unknown = [s for s in staged.names if s not in label_of]
        if unknown:
            raise ValueError(f"imagenet21k/{cfg.release}: {len(unknown)} synsets not in the label list, e.g. "
                             f"{unknown[:3]}; is this the {cfg.release} release?")
        self.build_report = staged.report
        self.report_extra = {"synsets_in_archive": len(staged.names), "resumed_units": staged.resumed,
                             "num_classes": len(synsets), "holdout_per_class": cfg.holdout_per_class,
                             "staging_bytes": staged.disk_bytes()}
        self._synsets = synsets
        return {split: self._generate_examples(staged, label_of, split, source) for split in ("train", "validation")}

    def _generate_examples(self, staged: staging.StagedUnits, label_of: dict[str, int], split: str, source: Path):
        if split == "train":
            return self._generate_train(staged, label_of, source)
        return self._generate_validation(staged, label_of)

    def _generate_train(self, staged: staging.StagedUnits, label_of: dict[str, int], source: Path):
        # The original JPEG bytes are streamed from the archive again; only converted images come from staging.
        seen = 0
        for synset, open_files in synset_units(source):
            names = staged.file_names(synset)
            wanted = set(names) - holdout(names, self.builder_config.holdout_per_class)
            for name, data in staged.files(synset, open_files, only=wanted):
                file_id = f"{synset}/{name}"
                yield file_id, features.example(data, label_of[synset], file_id)
            seen += 1
        if seen != len(staged.names):
            raise staging.SourceChangedError(f"imagenet21k: the archive now has {seen} synsets, staging found "
                                             f"{len(staged.names)}; delete {staged.directory} and prepare again")

    def _generate_validation(self, staged: staging.StagedUnits, label_of: dict[str, int]):
        for synset in staged.names:  # every held-out image was staged: no pass over the archive
            held = holdout(staged.file_names(synset), self.builder_config.holdout_per_class)
            for name, data in staged.files(synset, only=held):
                file_id = f"{synset}/{name}"
                yield file_id, features.example(data, label_of[synset], file_id)

    def write_extra_files(self, data_dir: Path) -> None:
        """Writes synsets.txt (the label order) next to the prepared data."""
        (data_dir / "synsets.txt").write_text("\n".join(self._synsets) + "\n")
