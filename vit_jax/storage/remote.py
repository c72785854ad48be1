"""Bucket paths (gs://...) through fsspec/gcsfs: one-line errors, whole-file transfers, transient-error accounting.

Retries are the clients' own: gcsfs retries HTTP 408/429/5xx, timeouts and dropped connections 6 times with
exponential backoff (about 1, 2, 4, 8, 16 s plus jitter: a persistent failure surfaces after ~35 s), tensorstore
(Orbax's array writer) retries likewise. `retries()` counts what they retried in this process: gcsfs reports each
retry on its logger (read here through a filter, no patching), tensorstore in its metrics. A failure that outlasts
the retries becomes a `StorageError` naming the path and the cause in one line.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from typing import Any, Callable

from vit_jax.errors import UserError, debug_enabled

CHUNK_BYTES = 64 * 2**20  # ranged reads of a download: one request each, retried on their own


class StorageError(UserError, OSError):
    """A bucket could not be read or written (after the client's retries), or does not exist. Not the user's
    mistake as a rule, but reported like one: one line naming path and cause, no traceback; exit status 1."""

    exit_code = 1


def is_url(path: str) -> bool:
    """`gs://...`, `s3://...`: a path with a scheme, which os.path must never touch (abspath makes it /cwd/gs:/...)."""
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", str(path)) is not None


# ---------------------------------------------------------------------------------------------------------------------
class _RetryCounter(logging.Filter):
    """Counts gcsfs's "retrying after exception" debug records. Its other records pass, those of a request that
    failed for good without their traceback (the failure is reported as one line; VIT_JAX_DEBUG keeps it)."""

    def __init__(self, keep_debug: bool) -> None:
        super().__init__()
        self.count = 0
        self.keep_debug = keep_debug
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            if record.exc_info and not debug_enabled():
                record.exc_info, record.exc_text = None, None
            return True
        if "retrying after exception" in str(record.msg):
            with self._lock:
                self.count += 1
        return self.keep_debug


def _install_counter() -> _RetryCounter:
    logger = logging.getLogger("gcsfs")
    for f in logger.filters:
        if isinstance(f, _RetryCounter):
            return f
    counter = _RetryCounter(keep_debug=logger.getEffectiveLevel() <= logging.DEBUG)
    logger.addFilter(counter)
    logger.setLevel(logging.DEBUG)  # the retry records are DEBUG; the filter drops them unless debug was on
    return counter


_COUNTER = _install_counter()


def _tensorstore_retries() -> int:
    ts = sys.modules.get("tensorstore")  # only if Orbax loaded it: never import it for a count
    if ts is None:
        return 0
    total = 0
    for metric in ts.experimental_collect_matching_metrics("/tensorstore/kvstore/gcs"):
        if metric["name"].endswith("/retries"):
            total += sum(int(v.get("value", 0)) for v in metric.get("values", []))
    return total


def retries() -> int:
    """Transient storage errors retried so far in this process (gcsfs and tensorstore)."""
    return _COUNTER.count + _tensorstore_retries()


def recovered_summary() -> str | None:
    """One line for the end of a run that recovered from transient storage errors (each retry is silent, its
    traceback kept for --verbose), or None when there were none."""
    n = retries()
    if not n:
        return None
    return (f"storage: recovered from {n} transient error(s) by retrying (HTTP 429/5xx, dropped or cut connections; "
            "storage/retries in metrics.jsonl)")


# ---------------------------------------------------------------------------------------------------------------------
def filesystem(url: str):
    """The fsspec filesystem of a URL's scheme (gcsfs for gs://), shared by the process."""
    import fsspec

    scheme = url.split("://", 1)[0]
    try:
        return fsspec.filesystem(scheme)
    except (ImportError, ValueError) as e:
        raise StorageError(f"{url}: no filesystem for {scheme}:// ({e})") from e


def cause(exc: BaseException) -> str:
    """The reason of a storage failure in a few words (HTTP status and message, or the exception)."""
    code = getattr(exc, "code", None) or getattr(exc, "status", None)
    text = " ".join(str(getattr(exc, "message", "") or exc).split())[:200].removesuffix(f", {code}")
    name = type(exc).__name__
    if code:
        return f"HTTP {code}: {text}" if text else f"HTTP {code}"
    return f"{name}: {text}" if text else name


def error(url: str, exc: BaseException, doing: str) -> StorageError:
    if isinstance(exc, StorageError):
        return exc
    return StorageError(f"{doing} {url} failed: {cause(exc)} (after the storage client's retries)")


def _call(url: str, doing: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - every client error becomes one line naming the path
        raise error(url, e, doing) from e


def info(url: str) -> dict | None:
    """The object's (or folder's) metadata, or None if it does not exist; StorageError if the bucket fails."""
    fs = filesystem(url)
    try:
        return _call(url, "reading", lambda: fs.info(url))
    except FileNotFoundError:
        return None


def exists(url: str) -> bool:
    """Unlike fsspec's exists(), an unreachable bucket raises instead of looking like a missing file."""
    return info(url) is not None


# GCS bucket names (cloud.google.com/storage/docs/buckets#naming): 3-63 characters (up to 222 with dots, each
# dot-separated part at most 63) of lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or
# digit. Checked up front: the emulator (and gcsfs) accept others, but tensorstore, which Orbax writes checkpoints
# with, rejects them at the first save, after training has run.
_GCS_BUCKET = re.compile(r"[a-z0-9](?:[a-z0-9._-]{1,220})[a-z0-9]")


def check_location(url: str, what: str) -> None:
    """Fails in one line, before any work, if the bucket of `url` is missing, unreachable or misnamed."""
    scheme = url.split("://", 1)[0]
    bucket = url.split("://", 1)[1].split("/", 1)[0]
    root = f"{scheme}://{bucket}"
    if scheme == "gs" and (not _GCS_BUCKET.fullmatch(bucket) or any(len(part) > 63 for part in bucket.split("."))):
        raise StorageError(f"{what} {url}: {bucket!r} is not a valid GCS bucket name (3-63 characters: lowercase "
                           f"letters, digits, '-', '_', '.'; starting and ending with a letter or digit)")
    try:
        found = info(root)
    except StorageError as e:
        raise StorageError(f"{what} {url}: {e}") from e
    if found is None:
        raise StorageError(f"{what} {url}: bucket {root} does not exist (or this account cannot see it)")


def listdir(url: str) -> list[str]:
    """Names directly under a folder URL ([] if it does not exist)."""
    fs = filesystem(url)
    try:
        entries = _call(url, "listing", lambda: fs.ls(url, detail=False, refresh=True))
    except FileNotFoundError:
        return []
    return sorted(os.path.basename(str(e).rstrip("/")) for e in entries)


def sizes(urls: list[str]) -> dict[str, int]:
    """{url: bytes} of objects, from one listing per folder rather than a metadata request per object (a file of a
    streamed split is then fetched with one request, not two). Objects not found are left out."""
    out: dict[str, int] = {}
    folders: dict[str, list[str]] = {}
    for url in urls:
        folders.setdefault(url.rsplit("/", 1)[0], []).append(url)
    for folder, members in folders.items():
        fs = filesystem(folder)
        scheme = folder.split("://", 1)[0]
        try:
            entries = _call(folder, "listing", lambda: fs.ls(folder, detail=True, refresh=True))
        except FileNotFoundError:
            continue
        found = {f"{scheme}://{fs._strip_protocol(e['name'])}": int(e["size"]) for e in entries
                 if e.get("type") == "file"}
        out.update((u, found[u]) for u in members if u in found)
    return out


def read_bytes(url: str) -> bytes:
    fs = filesystem(url)
    return _call(url, "reading", lambda: fs.cat_file(url))


def write_bytes(url: str, data: bytes) -> None:
    """One object write (atomic on GCS: readers see the old or the new object, never a part)."""
    fs = filesystem(url)
    _call(url, "writing", lambda: fs.pipe_file(url, data))


def fetch(url: str, local_path: str, size: int | None = None) -> int:
    """Downloads `url` to `local_path` (written as `.part`, renamed when complete) in ranged reads; returns bytes."""
    fs = filesystem(url)
    if size is None:
        meta = info(url)
        if meta is None:
            raise FileNotFoundError(f"{url} does not exist")
        size = int(meta["size"])
    tmp = f"{local_path}.part"
    with open(tmp, "wb") as f:
        for start in range(0, size, CHUNK_BYTES):
            end = min(size, start + CHUNK_BYTES)
            data = _call(url, "reading", lambda: fs.cat_file(url, start=start, end=end))
            if len(data) != end - start:
                raise StorageError(f"reading {url} failed: bytes {start}-{end} returned {len(data)} bytes")
            f.write(data)
    os.replace(tmp, local_path)
    return size


def upload_file(local_path: str, url: str) -> None:
    fs = filesystem(url)
    _call(url, "uploading to", lambda: fs.put_file(local_path, url))


def upload_tree(local_dir: str, url: str, last: tuple[str, ...] = (), progress: bool = True) -> dict[str, int]:
    """Uploads every file under `local_dir` to `url`, skipping objects that already exist with the same size (so an
    interrupted upload resumes), and the files named in `last` (by base name: small metadata) always, after all
    others, in that order: a reader that checks for them first never sees a partial tree. Returns {"uploaded": n, "skipped": n, "bytes": n}.
    """
    from tqdm import tqdm

    files = sorted(os.path.relpath(os.path.join(d, f), local_dir) for d, _, fs in os.walk(local_dir) for f in fs)
    order = {name: i for i, name in enumerate(last)}
    files.sort(key=lambda rel: (order.get(os.path.basename(rel), -1), rel))
    remote = {}
    fs = filesystem(url)
    try:
        listing = _call(url, "listing", lambda: fs.find(url, detail=True))
        prefix = fs._strip_protocol(url).rstrip("/") + "/"
        remote = {name[len(prefix):]: int(meta["size"]) for name, meta in listing.items() if name.startswith(prefix)}
    except FileNotFoundError:
        pass
    counts = {"uploaded": 0, "skipped": 0, "bytes": 0}
    total = sum(os.path.getsize(os.path.join(local_dir, rel)) for rel in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"upload to {url}", disable=not progress) as bar:
        for rel in files:
            local = os.path.join(local_dir, rel)
            size = os.path.getsize(local)
            if os.path.basename(rel) not in order and remote.get(rel) == size:
                counts["skipped"] += 1
            else:
                upload_file(local, f"{url.rstrip('/')}/{rel}")
                counts["uploaded"] += 1
                counts["bytes"] += size
            bar.update(size)
    return counts
