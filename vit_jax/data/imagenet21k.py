"""`imagenet21k`: ImageNet-21k from the official release archives, streamed (never unpacked to disk).

Put one of these in the TFDS manual_dir (default <data_dir>/downloads/manual):
- fall 2011: `fall11_whole.tar`; winter 2021: `winter21_whole.tar.gz` -- an outer archive of per-synset tars
  (`n01440764.tar` holding `n01440764_10026.JPEG`, ...);
- or the per-synset tars in a folder `fall11_whole/` / `winter21_whole/` (or directly in manual_dir).

Labels: fall11 uses the 21,843-synset list of the official i21k checkpoints (shipped in vit_jax/resources; two
synsets have no images); winter21 uses the sorted synsets found in the archive (written as synsets.txt next to
the data). Split: per synset, the `holdout_per_class` files with the smallest sha256(file name) go to
`validation` (never more than half of a synset), the rest to `train`.
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
        raise ValueError(f"unknown imagenet21k release '{release}'; choose one of {sorted(ARCHIVES)}")
    name = release if holdout_per_class == DEFAULT_HOLDOUT else f"{release}_holdout{holdout_per_class}"
    return Imagenet21kConfig(name=name, version="1.0.0", release=release, holdout_per_class=holdout_per_class,
                             description=f"ImageNet-21k {release} release, {holdout_per_class} validation images per class")


def parse_config_name(name: str) -> Imagenet21kConfig:
    m = re.fullmatch(r"(fall11|winter21)(?:_holdout(\d+))?", name)
    if not m:
        raise ValueError(f"unknown imagenet21k config '{name}'; use fall11, winter21 or e.g. fall11_holdout10")
    return make_config(m.group(1), int(m.group(2) or DEFAULT_HOLDOUT))


def find_release(manual_dir: str | os.PathLike, release: str) -> Path:
    """The release archive or folder of per-synset tars in manual_dir; a one-line error naming both if absent."""
    manual_dir = Path(manual_dir)
    archive = ARCHIVES[release]
    folder = archive.split(".")[0]
    for candidate in (manual_dir / archive, manual_dir / folder):
        if candidate.exists():
            return candidate
    if manual_dir.is_dir() and any(manual_dir.glob("n*.tar")):
        return manual_dir
    raise FileNotFoundError(
        f"imagenet21k/{release}: expected {manual_dir / archive} or a folder {manual_dir / folder}/ of per-synset "
        f"n*.tar files; download the release from image-net.org and pass --manual_dir")


def _inner_files(fileobj) -> Iterator[tuple[str, bytes]]:
    # Streaming mode: the inner tar is read front to back, nothing is extracted to disk.
    with tarfile.open(fileobj=fileobj, mode="r|*") as inner:
        for member in inner:
            if member.isfile():
                yield os.path.basename(member.name), inner.extractfile(member).read()


def synset_units(source: Path) -> Iterator[staging.Unit]:
    """(synset, files) for each per-synset tar of an outer archive (streamed) or a folder of tars."""
    if source.is_dir():
        for path in sorted(source.glob("n*.tar")):
            yield path.stem, lambda path=path: _inner_files(open(path, "rb"))
        return
    with tarfile.open(source, mode="r|*") as outer:
        for member in outer:
            if member.isfile() and member.name.endswith(".tar"):
                # Must be consumed before the outer stream moves on; stage_units does (or skips it entirely).
                fileobj = outer.extractfile(member)
                yield os.path.basename(member.name)[: -len(".tar")], lambda f=fileobj: _inner_files(f)


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

    def _info(self) -> tfds.core.DatasetInfo:
        names = fall11_synsets() if self.builder_config.release == "fall11" else None
        return tfds.core.DatasetInfo(builder=self, description=self.builder_config.description,
                                     features=features.image_features(names), supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
        cfg = self.builder_config
        source = find_release(dl_manager.manual_dir, cfg.release)
        staged = staging.stage_units(
            synset_units(source), Path(dl_manager.download_dir) / f"imagenet21k_{cfg.release}_staging",
            min_side=cfg.min_side, workers=self.num_workers,
            total=len(list(source.glob("n*.tar"))) if source.is_dir() else None, desc=f"imagenet21k/{cfg.release}")
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
                             "num_classes": len(synsets), "holdout_per_class": cfg.holdout_per_class}
        self._synsets = synsets
        return {split: self._generate_examples(staged, label_of, split) for split in ("train", "validation")}

    def _generate_examples(self, staged: staging.StagedUnits, label_of: dict[str, int], split: str):
        for synset in staged.names:
            names = staged.file_names(synset)
            held = holdout(names, self.builder_config.holdout_per_class)
            wanted = held if split == "validation" else set(names) - held
            for name, data in staged.files(synset, only=wanted):
                file_id = f"{synset}/{name}"
                yield file_id, features.example(data, label_of[synset], file_id)

    def write_extra_files(self, data_dir: Path) -> None:
        """Writes synsets.txt (the label order) next to the prepared data."""
        (data_dir / "synsets.txt").write_text("\n".join(self._synsets) + "\n")
