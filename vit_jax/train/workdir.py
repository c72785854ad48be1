"""Workdir paths: local directories or cloud buckets (gs://...) through etils.epath, with one write rule.

Orbax refuses relative checkpoint paths, so local workdirs are made absolute here, once. Object stores have no
append and no rename, so whole-file writes are used there; locally, files are replaced atomically.
"""

from __future__ import annotations

import os

from etils import epath


def resolve(workdir: str) -> str:
    """Absolute local path, or the bucket URL unchanged."""
    return workdir if "://" in workdir else os.path.abspath(os.path.expanduser(workdir))


def path(workdir: str, *parts: str) -> epath.Path:
    return epath.Path(workdir).joinpath(*parts)


def is_local(workdir: str) -> bool:
    return "://" not in workdir


def write_bytes(target: epath.Path, data: bytes) -> None:
    """Atomic on local disks (temp file + rename); a single object write on buckets (atomic there too)."""
    if "://" in str(target):
        target.write_bytes(data)
        return
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, target)
