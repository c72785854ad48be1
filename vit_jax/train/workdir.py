"""Workdir paths: local directories or cloud buckets (gs://...) through etils.epath, with one write rule.

Orbax refuses relative checkpoint paths, so local workdirs are made absolute here, once. Object stores have no
append and no rename, so whole-object writes are used there (storage.remote: one-line errors naming the path);
locally, files are replaced atomically.
"""

from __future__ import annotations

import os

from etils import epath

from vit_jax.storage import remote


def resolve(workdir: str) -> str:
    """Absolute local path, or the bucket URL unchanged."""
    return workdir.rstrip("/") if remote.is_url(workdir) else os.path.abspath(os.path.expanduser(workdir))


def path(workdir: str, *parts: str) -> epath.Path:
    return epath.Path(workdir).joinpath(*parts)


def is_local(workdir: str) -> bool:
    return not remote.is_url(str(workdir))


def check(workdir: str) -> None:
    """A bucket workdir whose bucket is missing or unreachable fails here, in one line, before any work."""
    if not is_local(workdir):
        remote.check_location(workdir, "workdir")


def write_bytes(target: epath.Path, data: bytes) -> None:
    """Atomic on local disks (temp file + rename); a single object write on buckets (atomic there too)."""
    if not is_local(str(target)):
        remote.write_bytes(str(target), data)
        return
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, target)
