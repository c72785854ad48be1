"""Resumable build staging: images are checked and cleaned one unit (a synset, a class folder) at a time.

Staging keeps only what cannot be read again from the source cheaply, so it stays small:
- `<unit>.json`: the unit's build report and its kept files in source order (position among the unit's files,
  name, size of the source bytes);
- `<unit>.tar`, only when it has members: the bytes of converted images (re-encoded once, see
  decode.sanitize_image) and of the few files the builder asks to keep (ImageNet-21k: the held-out validation
  images, so that writing the validation split needs no further pass over the archive).
Kept RGB JPEGs, the bulk, are never copied: the TFDS write reads them again from the source, original bytes,
skipping the files staging dropped and substituting the converted ones (`StagedUnits.files`).

Both files are written via temporary names and renames, the json last: its presence marks the unit complete, so an
interrupted build leaves only complete units behind and a rerun skips them without reading their images (reading
and checking ~14M images is the expensive part of preparing ImageNet-21k). The builder deletes the staging folder
once the build has succeeded (datasets.prepare_builder).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import io
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

from vit_jax.data.decode import KEPT, BuildReport, sanitize_image

@dataclasses.dataclass(frozen=True)
class NotAFile:
    """A source entry that is never stored, only counted (its report kind): an archive's symlink or hard-link
    member, a member whose name escapes its folder (`../x.jpg`, `/etc/x`), a device or fifo."""

    kind: str


# (file name, a function returning its bytes, or NotAFile). For a streamed tar the function only works until the
# iteration moves on, so callers read a file's bytes before advancing, or skip the file by not calling it.
FileIter = Iterable[tuple[str, Callable[[], bytes] | NotAFile]]
Unit = tuple[str, Callable[[], FileIter]]  # (unit name, opens the unit's files lazily, in a fixed order)
FORMAT = 2  # staged json layout; units staged in another layout (an older vit_jax) are staged again


class SourceChangedError(RuntimeError):
    """The source no longer holds what was staged (files replaced, reordered or removed since staging)."""


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

    def _meta(self, unit: str) -> dict:
        path = self.directory / f"{_file_stem(unit)}.json"
        if not path.exists():
            raise SourceChangedError(f"unit {unit} is in the source but was not staged in {self.directory}; the "
                                     f"source changed since staging: delete that folder and prepare again")
        return json.loads(path.read_text())

    def file_names(self, unit: str) -> list[str]:
        """The kept file names of a unit, in source order."""
        return [name for _, name, _ in self._meta(unit)["kept"]]

    def files(self, unit: str, source: Callable[[], FileIter] | None = None,
              only: set[str] | None = None) -> Iterator[tuple[str, bytes]]:
        """The kept (file name, bytes) of a unit in source order; only those named in `only` if given.

        Converted (and other staged) files come from the staging tar; the others are read again from `source`, the
        unit's file opener as given to stage_units, which is only opened if a wanted file is not staged. A source
        file whose name or size differs from what was staged raises SourceChangedError.
        """
        meta = self._meta(unit)
        wanted = [(pos, name, size) for pos, name, size in meta["kept"] if only is None or name in only]
        staged = self._staged_bytes(unit, meta, {pos for pos, _, _ in wanted})
        files = None
        for pos, name, size in wanted:
            if pos in staged:
                yield name, staged[pos]
                continue
            assert source is not None, f"{unit}/{name} is not staged: files() needs the unit's source"
            files = enumerate(source()) if files is None else files
            for at, (source_name, read) in files:
                if at == pos:
                    break
            else:
                source_name, read = None, None
            data = read() if source_name == name and callable(read) else None
            if data is None or len(data) != size:
                raise SourceChangedError(f"{unit}/{name} is not in the source as staged (file {pos}, {size} bytes): "
                                         f"the source changed since staging; delete {self.directory} and prepare again")
            yield name, data

    def _staged_bytes(self, unit: str, meta: dict, positions: set[int]) -> dict[int, bytes]:
        if not positions & set(meta["staged"]):
            return {}
        out = {}
        with tarfile.open(self.directory / f"{_file_stem(unit)}.tar", "r:") as tar:
            # Members are written in the order of meta["staged"], so duplicate file names cannot be confused.
            for pos, member in zip(meta["staged"], tar):
                if pos in positions:
                    out[pos] = tar.extractfile(member).read()
        return out

    def counts(self, unit: str) -> dict[str, int]:
        return self._meta(unit)["report"]["counts"]

    def disk_bytes(self) -> int:
        """The size of the staging folder's files."""
        return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file())


def _write_atomic(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_unit(directory: Path, unit: str, kept: list[list], stash: list[tuple[int, str, bytes]],
                report: BuildReport) -> None:
    stem = _file_stem(unit)

    def write_tar(f):
        with tarfile.open(fileobj=f, mode="w:") as tar:
            for _, name, data in stash:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    if stash:
        _write_atomic(directory / f"{stem}.tar", write_tar)
    meta = {"format": FORMAT, "unit": unit, "report": report.to_dict(), "kept": kept,
            "staged": [pos for pos, _, _ in stash]}
    # The json is renamed into place last: its presence is what marks the unit complete.
    _write_atomic(directory / f"{stem}.json", lambda f: f.write(json.dumps(meta).encode()))


def _staged_before(path: Path) -> dict | None:
    if not path.exists():
        return None
    meta = json.loads(path.read_text())
    return meta if meta.get("format") == FORMAT else None


def stage_units(
    units: Iterable[Unit],
    directory: str | os.PathLike,
    *,
    min_side: int = 8,
    workers: int | None = None,
    total: int | None = None,
    desc: str = "staging",
    keep_bytes: Callable[[str, list[str]], set[str]] | None = None,
) -> StagedUnits:
    """Checks and cleans every unit's images (see decode.sanitize_image), skipping units staged before.

    keep_bytes(unit, kept file names) names kept files whose bytes are staged too although the source has them.
    """
    from tqdm import tqdm

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    staged = StagedUnits(directory)
    workers = workers or os.cpu_count() or 1
    with concurrent.futures.ThreadPoolExecutor(workers) as pool, tqdm(total=total, desc=desc, unit="unit") as bar:
        for unit, open_files in units:
            if unit in staged.names:
                raise ValueError(f"unit {unit} appears twice in the source; remove the duplicate")
            staged.names.append(unit)
            before = _staged_before(directory / f"{_file_stem(unit)}.json")
            if before is not None:
                staged.report.merge(before["report"])
                staged.resumed += 1
                bar.update(1)
                continue
            files = [(name, read if isinstance(read, NotAFile) else read()) for name, read in open_files()]
            results = list(pool.map(lambda item: (None, item[1].kind) if isinstance(item[1], NotAFile)
                                    else sanitize_image(item[1], min_side=min_side), files))
            report, kept, converted = BuildReport(), [], set()
            for pos, ((name, data), (clean, kind)) in enumerate(zip(files, results)):
                report.add(kind, f"{unit}/{name}")
                if clean is not None:
                    kept.append([pos, name, len(data)])
                    if kind != KEPT:
                        converted.add(pos)
            extra = keep_bytes(unit, [name for _, name, _ in kept]) if keep_bytes else set()
            stash = [(pos, name, results[pos][0]) for pos, name, _ in kept if pos in converted or name in extra]
            _write_unit(directory, unit, kept, stash, report)
            staged.report.merge(report)
            bar.update(1)
    return staged
