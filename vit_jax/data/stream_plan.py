"""The batch plan of a dataset in a bucket: each process's rows come from its own stream (stream_order.py), read
from local copies of the stream's files that a spool fetches ahead (spool.py).

`StreamPlan` has the interface of pipeline.BatchPlan (`rows`, `substitute`, `eval_steps`, `state`), plus `schedule_steps`, which
the iterator calls as it submits batches: the files of the windows the submitted batches read are requested, then
those of the next `read_ahead` windows, and every other local file is deleted. Disk use is therefore about
(1 + read_ahead) windows of records plus the files that straddle window ends.
"""

from __future__ import annotations

import math

import numpy as np

from vit_jax.data.spool import SpooledRecords
from vit_jax.data.stream_order import StreamOrder

FETCH_THREADS = 4  # files downloaded at once per process
DEFAULT_WINDOW = 20_000  # records per shuffle window (config: data.stream_window)
DEFAULT_READ_AHEAD = 1  # windows fetched ahead (config: data.stream_read_ahead)


def _prefix_sizes(slice_sizes: list[int], limit: int) -> list[int]:
    out, left = [], limit
    for n in slice_sizes:
        out.append(min(n, left))
        left -= out[-1]
    return out


class StreamPlan:
    """Rows [lo, hi) of every global batch for this process (process_index of process_count), from its stream."""

    def __init__(self, records: SpooledRecords, global_batch_size: int, lo: int, hi: int, process_index: int,
                 process_count: int, *, train: bool, seed: int = 0, fraction: float = 1.0,
                 window: int = DEFAULT_WINDOW, read_ahead: int = DEFAULT_READ_AHEAD) -> None:
        self.records = records
        self.global_batch_size = global_batch_size
        self.train = train
        self.lo, self.hi = lo, hi
        self.rows_per_process = hi - lo
        if self.rows_per_process * process_count != global_batch_size:
            raise ValueError(f"the batch rows of the {process_count} processes are not equal ({lo}:{hi} of "
                             f"{global_batch_size}); a bucket stream needs the same number of rows per process")
        self.process_index, self.process_count = process_index, process_count
        self.num_records = len(records)
        sizes = [s.take for s in records.slices]
        if train and fraction < 1.0:  # the first round(f x n) records (TFDS writes its shards shuffled)
            sizes = _prefix_sizes(sizes, max(1, int(round(self.num_records * fraction))))
        kw = dict(seed=seed, process_count=process_count, window=window, shuffle=train)
        self.order = StreamOrder(sizes, process_index=process_index, **kw)
        self.read_ahead = max(0, int(read_ahead))
        self.window = self.order.window
        if not train:
            lengths = [StreamOrder(sizes, process_index=p, **kw).epoch_length(0) for p in range(process_count)]
            self.length = lengths[process_index]
            self.eval_steps = math.ceil(max(lengths) / self.rows_per_process)

    def rows(self, step: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(record indices, example ids for augmentation, eval mask or None) of this process's rows at `step`."""
        assert (lo, hi) == (self.lo, self.hi), "a stream plan serves one process's rows"
        k = step * self.rows_per_process + np.arange(self.rows_per_process, dtype=np.int64)
        ids = step * self.global_batch_size + np.arange(lo, hi, dtype=np.int64)
        if self.train:
            return self.order.records(k), ids, None
        # Eval: one pass over this process's share; rows past its end repeat its last record, masked out.
        mask = (k < self.length).astype(np.float32)
        return self.order.records(np.minimum(k, self.length - 1)), ids, mask

    def substitute(self, record: int, attempt: int) -> int:
        """The record that replaces an undecodable one: the next in the same file slice (wrapping), a file that is
        local already; the stream position does not move."""
        k, _ = self.records.locate(int(record))
        start, take = self.records.starts[k], self.records.slices[k].take
        return start + (int(record) - start + attempt) % take

    def _files(self, first: int, end: int) -> list[int]:
        return list(dict.fromkeys(self.records.file_of_slice[s] for s in self.order.slices(first, end)))

    def schedule_steps(self, oldest_step: int, newest_step: int) -> None:
        """Fetch what steps [oldest_step, newest_step] read, then the read-ahead; delete every other local file."""
        r = self.rows_per_process
        first, end = oldest_step * r, (newest_step + 1) * r
        if not self.train:
            end = min(end, self.length)
            first = min(first, end - 1)
        needed = self._files(first, end)
        ahead_start = self.order.window_end(end - 1)
        ahead_end = ahead_start + self.read_ahead * self.window
        if not self.train:
            ahead_start, ahead_end = min(ahead_start, self.length), min(ahead_end, self.length)
        ahead = self._files(ahead_start, ahead_end) if ahead_end > ahead_start else []
        files = list(dict.fromkeys(needed + ahead))
        self.records.spool.keep(files)
        self.records.spool.request(files)

    def state(self, step: int) -> dict:
        """What the checkpoint's data item adds for a stream: the process count and each process's position."""
        return {"stream": {"process_count": self.process_count,
                           "examples_per_process": step * self.rows_per_process}}

    def explain_resume(self, saved: dict, step: int) -> str | None:
        """Why resuming from the iterator state `saved` at `step` is not exact, in one line; None if it is."""
        stream = saved.get("stream")
        if stream is None:
            why = "was saved by a run that did not stream this dataset from a bucket"
        elif stream.get("process_count") != self.process_count:
            why = f"was saved by {stream.get('process_count')} processes and this run has {self.process_count}"
        else:
            return None
        return (f"data: the checkpoint's iterator state {why}: each process streams its own files, so every process "
                f"continues at position {step * self.rows_per_process} (step {step}) of a differently sharded "
                f"stream; batches differ from an uninterrupted run, and within the current epoch some examples "
                f"repeat and others are skipped; exact resume needs the same process count")

    def close(self) -> None:
        self.records.close()
