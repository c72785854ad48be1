"""The order in which each process reads a split streamed from a bucket: pure arithmetic, no state but a count.

Records are indexed 0..n-1 in the order of the split's file slices (the index space of sources.RecordSource). They
are cut into blocks of consecutive records of one file: whole files when there are at least
`MIN_BLOCKS_PER_PROCESS` x process_count of them, else each file in equal parts so that every process gets blocks.

Epoch e of process p (of P): training permutes the blocks with a generator seeded by (seed, e) and takes every P-th
from position p, so the processes of one epoch read disjoint files and together read every record once; eval
keeps the blocks in order and gives process p the p-th contiguous run. The process's epoch stream is its blocks'
records concatenated; training cuts it into windows of `window` records and permutes each window with a generator
seeded by (seed, e, P, p, window index), a shuffle whose memory is one window of records (on disk, see spool.py).
The process's endless stream is its epochs concatenated, so position k (= the examples it consumed) maps to a
record by arithmetic alone: resume needs only k, which is step x rows per process.

The order depends on the process count (each process reads its own files), unlike the global order of local data
(indexing.py); it is deterministic given (seed, process index, process count).
"""

from __future__ import annotations

import bisect
import collections
import math
from typing import Sequence

import numpy as np

MIN_BLOCKS_PER_PROCESS = 4
_BLOCK_STREAM = 2  # distinguishes these generators from those of indexing.py
_WINDOW_STREAM = 3


def make_blocks(slice_sizes: Sequence[int], process_count: int) -> np.ndarray:
    """Rows (slice, first record, end record) in the split's index space, in order."""
    starts = np.concatenate([[0], np.cumsum(slice_sizes)]).astype(np.int64)
    want = MIN_BLOCKS_PER_PROCESS * process_count
    nonempty = sum(1 for n in slice_sizes if n > 0)
    parts = 1 if nonempty >= want else math.ceil(want / max(1, nonempty))
    rows = []
    for k, n in enumerate(slice_sizes):
        cuts = np.linspace(0, n, min(parts, n) + 1).round().astype(np.int64) if n else []
        rows += [(k, starts[k] + a, starts[k] + b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    return np.asarray(rows, np.int64).reshape(-1, 3)


class StreamOrder:
    """Position k of process `process_index`'s stream -> record index; and which slices positions need."""

    def __init__(self, slice_sizes: Sequence[int], *, seed: int, process_index: int, process_count: int,
                 window: int, shuffle: bool) -> None:
        if not 0 <= process_index < process_count:
            raise ValueError(f"process {process_index} of {process_count}")
        self.seed, self.p, self.count = int(seed), int(process_index), int(process_count)
        self.window = max(1, int(window))
        self.shuffle = shuffle
        self.num_records = int(sum(slice_sizes))
        self.blocks = make_blocks(slice_sizes, process_count)
        if len(self.blocks) < process_count:
            raise ValueError(f"the split has {self.num_records} records, too few for {process_count} processes")
        self._epoch_starts = [0]  # stream position where each epoch starts (extended on demand)
        self._epochs: collections.OrderedDict = collections.OrderedDict()
        self._perms: collections.OrderedDict = collections.OrderedDict()

    # -- epochs ----------------------------------------------------------------------------------------------------
    def epoch_blocks(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(this process's block rows in read order, their cumulative lengths starting at 0) in `epoch`."""
        if epoch not in self._epochs:
            n = len(self.blocks)
            if self.shuffle:
                mine = np.random.default_rng([self.seed, epoch, _BLOCK_STREAM]).permutation(n)[self.p::self.count]
            else:
                mine = np.arange(self.p * n // self.count, (self.p + 1) * n // self.count)
            rows = self.blocks[mine]
            self._epochs[epoch] = (rows, np.concatenate([[0], np.cumsum(rows[:, 2] - rows[:, 1])]))
            if len(self._epochs) > 4:
                self._epochs.popitem(last=False)
        self._epochs.move_to_end(epoch)
        return self._epochs[epoch]

    def epoch_length(self, epoch: int) -> int:
        return int(self.epoch_blocks(epoch)[1][-1])

    def locate(self, k: int) -> tuple[int, int]:
        """(epoch, offset in that epoch's stream) of stream position k."""
        while self._epoch_starts[-1] <= k:
            self._epoch_starts.append(self._epoch_starts[-1] + self.epoch_length(len(self._epoch_starts) - 1))
        epoch = bisect.bisect_right(self._epoch_starts, k) - 1
        return epoch, k - self._epoch_starts[epoch]

    # -- windows ---------------------------------------------------------------------------------------------------
    def _window_bounds(self, epoch: int, offset: int) -> tuple[int, int, int]:
        w = offset // self.window
        return w, w * self.window, min((w + 1) * self.window, self.epoch_length(epoch))

    def _permutation(self, epoch: int, w: int, size: int) -> np.ndarray:
        key = (epoch, w)
        if key not in self._perms:
            self._perms[key] = np.random.default_rng(
                [self.seed, epoch, self.count, self.p, w, _WINDOW_STREAM]).permutation(size)
            if len(self._perms) > 4:
                self._perms.popitem(last=False)
        return self._perms[key]

    def records(self, positions: np.ndarray) -> np.ndarray:
        """Record indices at stream positions (non-negative ints)."""
        positions = np.asarray(positions, np.int64)
        out = np.empty_like(positions)
        for i, k in enumerate(positions.tolist()):
            epoch, offset = self.locate(k)
            w, lo, hi = self._window_bounds(epoch, offset)
            j = lo + (int(self._permutation(epoch, w, hi - lo)[offset - lo]) if self.shuffle else offset - lo)
            rows, cum = self.epoch_blocks(epoch)
            b = int(np.searchsorted(cum, j, side="right")) - 1
            out[i] = rows[b, 1] + j - cum[b]
        return out

    def slices(self, first: int, end: int) -> list[int]:
        """The slices holding every record positions [first, end) may read: those of the windows they touch, in
        read order (training draws a window's records in any order, so all of its files are needed)."""
        out: dict[int, None] = {}
        k = first
        while k < end:
            epoch, offset = self.locate(k)
            _, lo, hi = self._window_bounds(epoch, offset)
            if not self.shuffle:
                lo, hi = offset, min(hi, offset + end - k)
            rows, cum = self.epoch_blocks(epoch)
            a = int(np.searchsorted(cum, lo, side="right")) - 1
            b = int(np.searchsorted(cum, hi, side="left"))
            out.update(dict.fromkeys(int(s) for s in rows[a:b, 0]))
            k += hi - offset
        return list(out)

    def window_end(self, k: int) -> int:
        """The stream position where the window holding position k ends."""
        epoch, offset = self.locate(k)
        _, _, hi = self._window_bounds(epoch, offset)
        return k + hi - offset
