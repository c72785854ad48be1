"""Resumable build staging: images are checked and cleaned one unit (a synset, a class folder) at a time.

Each finished unit is written as `<unit>.tar` (the cleaned images, file names kept) plus `<unit>.json` (its
build report), via temporary names and renames, so an interrupted build leaves only complete units behind. A
rerun skips every unit whose tar exists without reading its source images; this is the expensive part of
preparing ImageNet-21k (reading and checking ~14M images), the final TFDS write that follows only copies bytes.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

from vit_jax.data.decode import BuildReport, sanitize_image

FileIter = Iterable[tuple[str, bytes]]  # (file name, encoded bytes)
Unit = tuple[str, Callable[[], FileIter]]  # (unit name, opens the unit's files lazily)


def _file_stem(unit: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", unit):
        return unit
    return "u_" + hashlib.sha256(unit.encode()).hexdigest()[:24]


class StagedUnits:
    """The result of staging: unit names in source order, each unit's kept files, and the merged report."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.names: list[str] = []
        self.report = BuildReport()
        self.resumed = 0  # units found complete from an earlier run

    def file_names(self, unit: str) -> list[str]:
        """The kept file names of a unit, in source order (reads tar headers only)."""
        with tarfile.open(self.directory / f"{_file_stem(unit)}.tar", "r:") as tar:
            return tar.getnames()

    def files(self, unit: str, only: set[str] | None = None) -> Iterator[tuple[str, bytes]]:
        """The kept (file name, bytes) of a unit in source order; only those named in `only` if given."""
        with tarfile.open(self.directory / f"{_file_stem(unit)}.tar", "r:") as tar:
            for member in tar:
                if only is None or member.name in only:
                    yield member.name, tar.extractfile(member).read()

    def counts(self, unit: str) -> dict[str, int]:
        return json.loads((self.directory / f"{_file_stem(unit)}.json").read_text())["report"]["counts"]


def _write_atomic(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_unit(directory: Path, unit: str, kept: list[tuple[str, bytes]], report: BuildReport) -> None:
    stem = _file_stem(unit)
    meta = json.dumps({"unit": unit, "report": report.to_dict()}).encode()
    _write_atomic(directory / f"{stem}.json", lambda f: f.write(meta))

    def write_tar(f):
        with tarfile.open(fileobj=f, mode="w:") as tar:
            for name, data in kept:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    # The tar is renamed into place last: its presence is what marks the unit complete.
    _write_atomic(directory / f"{stem}.tar", write_tar)


def stage_units(
    units: Iterable[Unit],
    directory: str | os.PathLike,
    *,
    min_side: int = 8,
    workers: int | None = None,
    total: int | None = None,
    desc: str = "staging",
) -> StagedUnits:
    """Checks and cleans every unit's images (see decode.sanitize_image), skipping units staged before."""
    from tqdm import tqdm

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    staged = StagedUnits(directory)
    workers = workers or os.cpu_count() or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool, tqdm(total=total, desc=desc, unit="unit") as bar:
        for unit, open_files in units:
            stem = _file_stem(unit)
            if unit in staged.names:
                raise ValueError(f"unit {unit} appears twice in the source; remove the duplicate")
            staged.names.append(unit)
            if (directory / f"{stem}.tar").exists() and (directory / f"{stem}.json").exists():
                staged.report.merge(json.loads((directory / f"{stem}.json").read_text())["report"])
                staged.resumed += 1
                bar.update(1)
                continue
            files = list(open_files())
            results = pool.map(lambda item: sanitize_image(item[1], min_side=min_side), files)
            report, kept = BuildReport(), []
            for (name, _), (data, kind) in zip(files, results):
                report.add(kind, f"{unit}/{name}")
                if data is not None:
                    kept.append((name, data))
            _write_unit(directory, unit, kept, report)
            staged.report.merge(report)
            bar.update(1)
    return staged
