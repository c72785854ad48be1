"""What is wrong with a checkpoint step that failed to restore, in one line naming the file.

Orbax reports a damaged array file as "Encountered error while reading array index: (...). See full TensorStore
details: <a 60-line spec>", which names neither the file nor the fault. Our state is an OCDBT database (Orbax's
default): a manifest pointing at B-tree nodes, whose entries point at byte ranges of data files (`d/<hash>`). Walking
those references and comparing them with the files' sizes finds a truncated or missing file without reading any
array; for other damage (a corrupt byte) the failed key's file is named beside TensorStore's own first line.
"""

from __future__ import annotations

import re
from typing import Any

from etils import epath

_SPEC = re.compile(r"\s*\[tensorstore_spec=.*$|\s*See full TensorStore details:.*$", re.S)
_FAILED_KEY = re.compile(r'Error reading "([^"]+)" in OCDBT database')


def root_cause(exc: BaseException) -> str:
    """The innermost exception of the chain (TensorStore's, under Orbax's wrapper) as 'Type: first line', without
    the TensorStore spec that follows it."""
    seen = set()
    while id(exc) not in seen and (exc.__cause__ or exc.__context__) is not None:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    lines = str(exc).strip().splitlines()
    text = _SPEC.sub("", lines[0] if lines else "")
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _kvstore(path: epath.Path) -> dict[str, Any]:
    text = str(path).rstrip("/") + "/"
    if text.startswith("gs://"):
        bucket, _, rest = text[len("gs://"):].partition("/")
        return {"driver": "gcs", "bucket": bucket, "path": rest}
    return {"driver": "file", "path": text}


def _size(path: epath.Path) -> int | None:
    try:
        return int(path.stat().length)
    except FileNotFoundError:
        return None


class _Database:
    """The files an OCDBT database references: {relative path: (bytes it must hold at least, keys stored there)}."""

    def __init__(self, root: epath.Path):
        import tensorstore as ts

        self.root = root
        self.files: dict[str, tuple[int, list[str]]] = {}
        self._ts = ts
        self._store = ts.KvStore.open(_kvstore(root)).result()

    def _need(self, relative: str, end: int, key: str | None = None) -> None:
        need, keys = self.files.get(relative, (0, []))
        self.files[relative] = (max(need, end), keys + ([key] if key else []))

    def walk(self) -> str | None:
        """Records every reference; returns the first file found short or missing on the way (a B-tree node must be
        whole before it can be read), else None."""
        manifest = self._ts.ocdbt.dump(self._store).result()
        if not manifest.get("versions"):
            return None
        pending = [manifest["versions"][-1]["root"]["location"]]  # the newest version is what a restore reads
        while pending:
            location = pending.pop()
            relative, end = _location(location)
            self._need(relative, end)
            problem = self.problem(relative)
            if problem:
                return problem
            node = self._ts.ocdbt.dump(self._store, location).result()
            for entry in node.get("entries", []):
                key = entry.get("key", b"")
                key = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
                for value in entry.values():
                    if isinstance(value, str) and value.startswith("btreenode::"):
                        pending.append(value)
                    elif isinstance(value, str) and value.startswith("value:"):
                        relative, end = _location(value)
                        self._need(relative, end, key)
        return None

    def problem(self, relative: str) -> str | None:
        need, keys = self.files[relative]
        size = _size(self.root / relative)
        held = f"; it holds {_arrays(keys)}" if keys else ""
        if size is None:
            return f"state/{relative} is missing{held}"
        if size < need:
            return f"state/{relative} is truncated ({size:,} bytes, {need:,} expected){held}"
        return None

    def file_of(self, key: str) -> str | None:
        return next((relative for relative, (_, keys) in self.files.items() if key in keys), None)


def _location(text: str) -> tuple[str, int]:
    """'btreenode::d/<hash>:<offset>:<length>[:...]' or 'value:<base>:d/<hash>:<offset>:<length>' -> (the file
    relative to the database root, the end of the byte range)."""
    kind, _, rest = text.partition(":")
    if kind == "btreenode":
        parts = rest.lstrip(":").split(":")
        return parts[0], int(parts[1]) + int(parts[2])
    base, relative, offset, length = rest.split(":")[:4]
    return base + relative, int(offset) + int(length)


def _arrays(keys: list[str]) -> str:
    names = sorted({k.split("/")[0] for k in keys})
    more = f" and {len(names) - 1} other array(s)" if len(names) > 1 else ""
    return f"{names[0]}{more}"


def describe(step_dir: epath.Path, exc: BaseException) -> str:
    """One line: which file of the step is damaged and how, or (when the files look whole) the file of the key that
    failed with TensorStore's reason, or that reason alone."""
    cause = root_cause(exc)
    try:
        db = _Database(step_dir / "state")
        found = db.walk()
    except Exception:  # noqa: BLE001 - not an OCDBT database, or its manifest is the damage: TensorStore's words
        return cause
    if found:
        return found
    problem = next(filter(None, (db.problem(relative) for relative in db.files)), None)
    if problem:
        return problem
    key = _FAILED_KEY.search(cause)
    relative = db.file_of(key.group(1)) if key else None
    return f"state/{relative}: {cause}" if relative else cause
