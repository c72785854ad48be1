"""Local copies of a bucket's record files: whole files fetched ahead by a few threads, read with the local readers.

A record file in a bucket is only ever read whole: `Spool.request` starts fetching files (in request order, at
most `parallel` at once, each in 64 MiB ranged reads: see storage.remote.fetch) into a private local folder, and
`Spool.read(file, index)` returns one record of a fetched file, waiting for it if needed. So a step's records cost
no request at all, and the per-request latency of the bucket is hidden behind the read-ahead. What stays on disk
is decided by the reader: `keep(files)` (the streaming plan: the files of the windows in use and the read-ahead)
deletes the others once no thread reads them; without a plan, the `max_files` most recently used stay. The folder
is `$VIT_JAX_SPOOL_DIR` (default: the system temp dir) / `vit_jax_spool_<host>_<pid>_*`, deleted by `close()` (and at
exit); those of killed processes by the next spool made on the host (storage/scratch.py).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import os
import shutil
import threading
import time
from typing import Iterable, Sequence

from vit_jax.data.sources import FileSlice, read_records
from vit_jax.storage import remote, scratch


class _File:
    def __init__(self, url: str, size_records: int) -> None:
        self.url = url
        self.records_in_file = size_records
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.records = None
        self.path: str | None = None
        self.users = 0
        self.retired = False
        self.last_used = 0.0

    def close(self) -> None:
        records, self.records = self.records, None
        if records is not None:
            if hasattr(records, "close"):
                records.close()
            elif hasattr(records, "__exit__"):
                records.__exit__(None, None, None)
        if self.path and os.path.exists(self.path):
            os.remove(self.path)


class Spool:
    """Whole-file local copies of remote record files (`urls[i]` holds `sizes[i]` records), fetched ahead."""

    def __init__(self, urls: Sequence[str], sizes: Sequence[int], file_format: str, *, parallel: int = 4,
                 max_files: int | None = None) -> None:
        self.urls, self.sizes, self.file_format = list(urls), list(sizes), file_format
        self.max_files = max_files
        # Object sizes from one listing per folder: each fetch is then a single ranged read, no metadata request.
        self.byte_sizes = remote.sizes(self.urls)
        self.directory = scratch.make_private_dir("vit_jax_spool_", os.environ.get("VIT_JAX_SPOOL_DIR") or None)
        self._pool = concurrent.futures.ThreadPoolExecutor(max(1, parallel), "vit_jax_spool")
        self._files: dict[int, _File] = {}
        self._lock = threading.Lock()
        self.bytes_fetched = 0
        self.files_fetched = 0
        self.wait_s = 0.0  # time readers spent waiting for a file (the read-ahead was not far enough ahead)
        self._closed = False

    # -- fetching ------------------------------------------------------------------------------------------------
    def _fetch(self, i: int, f: _File) -> None:
        try:
            if f.retired:  # dropped before its turn came
                return
            path = os.path.join(self.directory, f"{i:06d}_{os.path.basename(f.url)}")
            size = remote.fetch(f.url, path, self.byte_sizes.get(f.url))
            f.path = path
            f.records = read_records(self.file_format, [FileSlice(path, 0, f.records_in_file, f.records_in_file)])
            with self._lock:
                self.bytes_fetched += size
                self.files_fetched += 1
                if f.retired and f.users == 0:
                    f.close()
        except BaseException as e:  # noqa: BLE001 - handed to the reader that waits for this file
            f.error = e
        finally:
            f.ready.set()

    def _entry(self, i: int) -> _File:
        """The file's entry, its fetch started if it was not requested yet; call with the lock held."""
        f = self._files.get(i)
        if f is None:
            if self._closed:
                raise RuntimeError("the spool is closed")
            f = self._files[i] = _File(self.urls[i], self.sizes[i])
            self._pool.submit(self._fetch, i, f)
        f.last_used = time.monotonic()
        return f

    def request(self, files: Iterable[int]) -> None:
        """Starts fetching these files (in this order, after those requested before) unless present or in flight."""
        with self._lock:
            for i in files:
                self._entry(int(i))

    def _retire(self, i: int) -> None:
        f = self._files.pop(i)
        f.retired = True
        if f.users == 0 and f.ready.is_set():
            f.close()

    def keep(self, files: Iterable[int]) -> None:
        """Deletes every local file not listed (each once no reader uses it; a fetch in flight finishes first)."""
        wanted = {int(i) for i in files}
        with self._lock:
            for i in [i for i in self._files if i not in wanted]:
                self._retire(i)

    def local_files(self) -> list[int]:
        with self._lock:
            return sorted(self._files)

    # -- reading -------------------------------------------------------------------------------------------------
    def read(self, i: int, index: int) -> bytes:
        """Record `index` of file `i` (fetching the file if nobody requested it)."""
        with self._lock:
            f = self._entry(i)
            f.users += 1
            if self.max_files is not None and len(self._files) > self.max_files:
                idle = sorted((g.last_used, j) for j, g in self._files.items() if g.users == 0 and j != i)
                for _, j in idle[: len(self._files) - self.max_files]:
                    self._retire(j)
        try:
            if not f.ready.is_set():
                t = time.perf_counter()
                f.ready.wait()
                with self._lock:
                    self.wait_s += time.perf_counter() - t
            if f.error is not None:
                raise f.error
            return f.records[index]
        finally:
            with self._lock:
                f.users -= 1
                if f.retired and f.users == 0:
                    f.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for i in list(self._files):
                self._retire(i)
        self._pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.directory, ignore_errors=True)


class SpooledRecords:
    """Random access to the records of remote file slices (the index space of sources.RecordSource) via a spool."""

    def __init__(self, slices: Sequence[FileSlice], file_format: str, *, parallel: int = 4,
                 max_files: int | None = None) -> None:
        self.slices = list(slices)
        urls = list(dict.fromkeys(s.filename for s in self.slices))
        self.file_of_slice = [urls.index(s.filename) for s in self.slices]
        sizes = [0] * len(urls)
        for s, f in zip(self.slices, self.file_of_slice):
            sizes[f] = s.examples_in_shard
        self.spool = Spool(urls, sizes, file_format, parallel=parallel, max_files=max_files)
        self.starts = [0]
        for s in self.slices:
            self.starts.append(self.starts[-1] + s.take)

    def __len__(self) -> int:
        return self.starts[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """(slice, record within the slice's file) of a record index."""
        k = bisect.bisect_right(self.starts, index) - 1
        return k, self.slices[k].skip + index - self.starts[k]

    def file_of(self, index: int) -> int:
        return self.file_of_slice[self.locate(index)[0]]

    def __getitem__(self, index: int) -> bytes:
        if not 0 <= index < len(self):
            raise IndexError(index)
        k, local = self.locate(int(index))
        return self.spool.read(self.file_of_slice[k], local)

    def close(self) -> None:
        self.spool.close()

