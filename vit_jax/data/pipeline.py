"""The input pipeline: one mechanism for train and eval, producing global `jax.Array` batches.

Guarantees for local data (tested in tests/data/test_pipeline.py; a dataset in a bucket is streamed instead, see
stream_plan.py and docs/data.md):
- The global batch at step s is a pure function of (seed, s): the same records in the same order with the same
  augmentation randomness for any number of processes or devices (see indexing.py). Each process loads only the
  rows of the batch its devices hold, read from the batch sharding, and the rows of all processes are stitched
  into one global array per field with `jax.make_array_from_process_local_data`.
- Resume is exact: `get_state()` is a small JSON-able dict, identical on every process; restoring it (on any
  topology) continues with exactly the batches an uninterrupted run would have produced.
- Eval runs in fixed order; the last batch is padded and `_mask` marks real rows, so every example counts once.
- A record that cannot be decoded is never fatal: in training it is replaced by the next record
  (deterministically) and counted; in eval its row is masked out like padding (so no example counts twice) and
  counted as undecodable.

Why a small thread pool rather than Grain: Grain shards a dataset per process (`ds[process_index::count]`),
which makes batch contents depend on the process count; here work is addressed by global position, which keeps
topology independence and exact resume trivially true. OpenCV, PIL and numpy release the GIL, so threads scale.

Each worker task loads a contiguous chunk of a batch's rows and writes every example straight into the batch's
preallocated arrays (the final float32 image directly, when the op string ends its pixel work with value_range or
normalize: see pp.IMAGE_OUT), so no per-example future and no stacking copy is needed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import math
import os
import sys
import threading
from typing import Any, Iterator

import jax
import numpy as np

from vit_jax.data import indexing, pp as pp_lib
from vit_jax.data.datasets import Dataset, open_dataset  # noqa: F401 - re-exported: pipeline.open_dataset
from vit_jax.data.decode import DecodeError
from vit_jax.data.repeated import RepeatedSchedule, check_repeats
from vit_jax.errors import ConfigError

MAX_SUBSTITUTES = 16  # consecutive bad records tolerated before the data is declared damaged
STATE_VERSION = 1
log = logging.getLogger(__name__)


def _finalize(ex: dict[str, Any], raw: dict[str, Any], num_classes: int) -> dict[str, np.ndarray]:
    """Applies the batch contract to one preprocessed example (see docs/data.md)."""
    image = ex.get("image")
    if isinstance(image, (bytes, np.bytes_)):
        raise ValueError("the op string never decodes the image: start it with decode or a decode_* op")
    out = {}
    for key, value in ex.items():
        if key in ("label", "labels") or isinstance(value, (bytes, str, np.bytes_, np.str_)):
            continue
        arr = np.asarray(value)
        if arr.dtype.kind in "biuf":  # numbers only: ids, file names, raw bytes cannot become jax arrays
            out[key] = arr
    if "image" in out and out["image"].dtype != np.float32:
        out["image"] = out["image"].astype(np.float32)
    label = int(ex.get("label", raw.get("label", -1)))
    out["label"] = np.int32(label)
    labels = ex.get("labels")
    if isinstance(labels, np.ndarray) and labels.dtype.kind == "f":
        out["labels"] = labels.astype(np.float32, copy=False)
    elif num_classes:  # no onehot/multihot op: multi-hot of the stored labels (one-hot of label)
        ids = np.asarray(raw.get("labels", [label] if label >= 0 else []), np.int64).reshape(-1)
        vec = np.zeros((num_classes,), np.float32)
        vec[ids] = 1.0
        out["labels"] = vec
    return out


class _Rows:
    """The process-local rows of one batch: numpy arrays filled in place, row by row, by the worker threads.

    The arrays are allocated when the first example arrives (its keys, shapes and dtypes); every other example must
    have the same, as np.stack would require.
    """

    def __init__(self, size: int, spare: dict[str, np.ndarray] | None = None) -> None:
        self.size = size
        self.arrays: dict[str, np.ndarray] | None = None
        self.cancelled = False  # set when the batch will never be delivered: its workers stop early
        self._spare = spare  # arrays of an earlier batch that nobody references any more (see _Recycler)
        self._lock = threading.Lock()

    def _allocate(self, ex: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        spare, self._spare = self._spare, None
        if spare is not None and spare.keys() == ex.keys() and all(
                a.shape == (self.size,) + ex[k].shape and a.dtype == ex[k].dtype for k, a in spare.items()):
            return spare
        return {k: np.empty((self.size,) + v.shape, v.dtype) for k, v in ex.items()}

    def image_out(self, row: int) -> np.ndarray | None:
        """The float32 image row to offer the op string as pp.IMAGE_OUT, once the arrays exist."""
        arrays = self.arrays
        image = None if arrays is None else arrays.get("image")
        return image[row] if image is not None and image.dtype == np.float32 else None

    def put(self, row: int, ex: dict[str, np.ndarray], written: np.ndarray | None = None) -> None:
        """Stores one example at `row`; `written` is an array already in place (the row offered as image_out)."""
        if self.arrays is None:
            with self._lock:
                if self.arrays is None:
                    self.arrays = self._allocate(ex)
        if ex.keys() != self.arrays.keys():
            raise ValueError(f"examples have different keys {sorted(ex)} and {sorted(self.arrays)}")
        for key, value in ex.items():
            dst = self.arrays[key]
            if value.shape != dst.shape[1:]:
                raise ValueError(f"examples have different '{key}' shapes {sorted({value.shape, dst.shape[1:]})}: "
                                 "add a resize/crop op so every example has one size")
            if value.dtype != dst.dtype:
                raise ValueError(f"examples have different '{key}' dtypes {value.dtype} and {dst.dtype}")
            if value is not written:
                dst[row] = value


def _reference_count(arrays: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(arrays[i])


class _Recycler:
    """Reuses the host arrays of delivered batches that nothing references any more.

    A batch's arrays are tens of MB, so each fresh allocation is a new mapping whose pages the kernel zeroes on
    first touch (~0.07 ms of CPU per 224x224 image). The arrays of the last `keep` delivered batches are remembered,
    and a new batch takes the arrays of one that no one else references: the caller's batch dict, a view of an
    array, a jax.Array aliasing the memory, an in-flight transfer all hold a reference, which CPython's exact
    reference count shows. The count of a private array is measured once through the same code path, so the test
    does not depend on how the interpreter counts its own temporary references.
    """

    def __init__(self, keep: int = 2) -> None:
        self._kept: collections.deque[tuple[list[str], list[np.ndarray]]] = collections.deque(maxlen=keep)
        self._private = _reference_count([np.empty(0)], 0)

    def delivered(self, arrays: dict[str, np.ndarray]) -> None:
        self._kept.append((list(arrays), list(arrays.values())))

    def take(self) -> dict[str, np.ndarray] | None:
        for i, (keys, arrays) in enumerate(self._kept):
            if all(_reference_count(arrays, j) <= self._private for j in range(len(arrays))):
                del self._kept[i]
                return dict(zip(keys, arrays))
        return None


class _Loader:
    """Loads and preprocesses examples by record index; substitutes undecodable records (by default with the next
    record of the split; a plan may choose another rule as `substitute`)."""

    def __init__(self, ds: Dataset, split: str, pp: str, seed: int, source=None) -> None:
        self.source = source if source is not None else ds.source(split)
        self.substitute = lambda record, attempt: (int(record) + attempt) % len(self.source)
        self.preprocess = pp_lib.build(pp)
        self.seed = seed
        self.num_classes = ds.num_classes
        self.substituted = 0
        self._lock = threading.Lock()

    def load(self, record: int, position: int) -> dict[str, np.ndarray]:
        return self.load_counted(record, position)[0]

    def load_counted(self, record: int, position: int,
                     image_out: np.ndarray | None = None) -> tuple[dict[str, np.ndarray], int]:
        """(example, number of undecodable records skipped to produce it); see pp.IMAGE_OUT for image_out."""
        for attempt in range(MAX_SUBSTITUTES + 1):
            index = self.substitute(record, attempt)
            try:
                raw = self.source[index]
                ex = dict(raw)
                if image_out is not None:
                    ex[pp_lib.IMAGE_OUT] = image_out
                # A fresh generator per attempt: the substitute's augmentation does not depend on the failure.
                ex = self.preprocess(ex, indexing.example_rng(self.seed, position))
                ex.pop(pp_lib.IMAGE_OUT, None)
                return _finalize(ex, raw, self.num_classes), attempt
            except DecodeError as e:
                with self._lock:
                    self.substituted += 1
                    if self.substituted <= 10:
                        log.warning("record %d is undecodable (%s); record %d fills its row (masked out in eval)",
                                    index, e, self.substitute(record, attempt + 1))
        raise RuntimeError(f"{MAX_SUBSTITUTES + 1} consecutive records from {record} cannot be decoded; "
                           f"the prepared data is damaged: prepare it again")

    def load_rows(self, rows: _Rows, records: np.ndarray, positions: np.ndarray, lo: int, hi: int,
                  mask: np.ndarray | None = None) -> int:
        """Loads rows [lo, hi) of a batch into `rows`; returns the number of undecodable records met.

        Train (mask None): the count of records skipped by substitution. Eval: a real row (mask 1) whose record is
        undecodable is still filled by the next record, so the batch keeps one shape, but its mask is set to 0 in
        place, like padding: the substitute is counted at its own position, never twice. Counted: such rows.
        """
        bad = 0
        for row in range(lo, hi):
            if rows.cancelled:
                break
            image_out = rows.image_out(row)
            ex, skipped = self.load_counted(records[row], positions[row], image_out)
            rows.put(row, ex, written=image_out)
            if mask is None:
                bad += skipped
            elif skipped and mask[row] > 0:
                mask[row] = 0.0
                bad += 1
        return bad


def _chunks(size: int, count: int) -> list[tuple[int, int]]:
    """`count` contiguous [lo, hi) ranges covering range(size), sizes differing by at most one."""
    count = max(1, min(size, count))
    bounds = [size * i // count for i in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


class BatchPlan:
    """Which records and positions make up the rows [lo, hi) of the global batch at a step."""

    def __init__(self, num_records: int, global_batch_size: int, *, train: bool, seed: int = 0,
                 fraction: float = 1.0, repeats: int = 1) -> None:
        self.global_batch_size = global_batch_size
        self.train = train
        self.num_records = num_records
        self.schedule = indexing.EpochSchedule(num_records, seed, fraction if train else 1.0, shuffle=train)
        if train and repeats > 1:  # repeated augmentation: each image `repeats` times per global batch
            self.schedule = RepeatedSchedule(self.schedule, global_batch_size, repeats)
        self.eval_steps = math.ceil(num_records / global_batch_size)

    def substitute(self, record: int, attempt: int) -> int:
        return (int(record) + attempt) % self.num_records

    def schedule_steps(self, oldest_step: int, newest_step: int) -> None:
        """Local files need no fetching (see stream_plan.StreamPlan.schedule_steps)."""

    def state(self, step: int) -> dict:
        return {}  # the global order is a function of the step alone

    def explain_resume(self, saved: dict, step: int) -> None:
        return None  # any topology continues exactly

    def close(self) -> None:
        pass

    def rows(self, step: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(record indices, global positions, eval mask or None) of rows [lo, hi) at `step`."""
        positions = step * self.global_batch_size + np.arange(lo, hi, dtype=np.int64)
        if self.train:
            return self.schedule.records(positions), positions, None
        mask = (positions < self.num_records).astype(np.float32)
        return positions % self.num_records, positions, mask


class BatchIterator:
    """Prefetching iterator of global batches over steps [start, end) (end=None: forever in training, one pass in
    eval). A dataset in a bucket is streamed (stream_plan.py); `stream` holds its window and read-ahead."""

    def __init__(self, ds: Dataset, split: str, pp: str, global_batch_size: int, sharding, *, train: bool,
                 seed: int, fraction: float, start_step: int, end_step: int | None, num_workers: int | None,
                 prefetch: int, to_device: bool = True, stream: dict | None = None, repeats: int = 1) -> None:
        self.dataset_name, self.split, self.seed, self.fraction = ds.name, split, int(seed), float(fraction)
        self.global_batch_size = int(global_batch_size)
        self.repeats = int(repeats) if train else 1
        check_repeats(self.repeats, self.global_batch_size)
        self._sharding = sharding
        self._field_sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*sharding.spec[:1]))
        self.lo, self.hi = indexing.sharding_rows(sharding, self.global_batch_size)
        if ds.remote:
            from vit_jax.data.stream_plan import StreamPlan

            if self.repeats > 1:
                raise ConfigError("data.repeated_augmentation works on local data; a dataset streamed from a "
                                  "bucket reads each process's own files (set it to 1, or copy the data locally)")

            records = ds.spooled_records(split)
            self.loader = _Loader(ds, split, pp, self.seed, source=ds.source(split, records=records))
            self.plan = StreamPlan(records, self.global_batch_size, self.lo, self.hi, jax.process_index(),
                                   jax.process_count(), train=train, seed=self.seed, fraction=fraction,
                                   **(stream or {}))
            self.loader.substitute = self.plan.substitute
        else:
            self.loader = _Loader(ds, split, pp, self.seed)
            self.plan = BatchPlan(len(self.loader.source), self.global_batch_size, train=train, seed=self.seed,
                                  fraction=fraction, repeats=self.repeats)
        self._end = end_step if train or end_step is not None else self.plan.eval_steps
        self._to_device = to_device  # False: process-local numpy batches (benchmarks, debugging)
        self._prefetch = max(0, int(prefetch))
        self._num_workers = num_workers or os.cpu_count() or 1
        self._workers = concurrent.futures.ThreadPoolExecutor(self._num_workers, "vit_jax_data")
        self._assembler = concurrent.futures.ThreadPoolExecutor(1, "vit_jax_batch")
        self._queue: collections.deque = collections.deque()
        self._recycler = _Recycler()
        self._substituted = 0
        self._undecodable = 0
        self._reset(start_step)

    def _reset(self, step: int) -> None:
        for fut, rows in self._queue:
            rows.cancelled = True  # running chunks stop after their current example
            fut.cancel()
        self._queue.clear()
        self._step = self._submitted = int(step)

    def _assemble(self, rows: _Rows, chunks: list, mask: np.ndarray | None) -> tuple[dict[str, jax.Array], int]:
        bad = sum(chunk.result() for chunk in chunks)  # after this the workers' writes to `mask` are done
        if rows.cancelled:
            return {}, 0
        local = dict(rows.arrays)
        if mask is not None:
            local["_mask"] = mask
        if not self._to_device:
            return local, bad
        batch = {key: jax.make_array_from_process_local_data(
                     self._field_sharding, value, (self.global_batch_size,) + value.shape[1:])
                 for key, value in local.items()}
        return batch, bad

    def _fill(self) -> None:
        while len(self._queue) <= self._prefetch and (self._end is None or self._submitted < self._end):
            self.plan.schedule_steps(self._step, self._submitted)
            records, positions, mask = self.plan.rows(self._submitted, self.lo, self.hi)
            rows = _Rows(len(records), spare=self._recycler.take())
            chunks = [self._workers.submit(self.loader.load_rows, rows, records, positions, lo, hi, mask)
                      for lo, hi in _chunks(len(records), self._num_workers)]
            self._queue.append((self._assembler.submit(self._assemble, rows, chunks, mask), rows))
            self._submitted += 1

    def __iter__(self) -> Iterator[dict[str, jax.Array]]:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        self._fill()
        if not self._queue:
            raise StopIteration
        future, rows = self._queue.popleft()
        batch, bad = future.result()
        self._recycler.delivered(rows.arrays)
        del future, rows  # only the recycler (and the caller, through `batch`) reference the arrays now
        if self.plan.train:
            self._substituted += bad
        else:
            self._undecodable += bad
        self._step += 1
        self._fill()  # start the next batches before the caller's step runs
        return batch

    @property
    def num_substituted(self) -> int:
        """Train: undecodable records replaced in the batches returned so far (rows of this process only)."""
        return self._substituted

    @property
    def num_records(self) -> int:
        """Records of the split (one eval pass covers each once: as a real row, or masked out if undecodable)."""
        return self.plan.num_records

    @property
    def num_undecodable(self) -> int:
        """Eval: examples given mask 0 because their record is undecodable, in the batches returned so far (rows of
        this process only; classification.evaluate reports the global number as `undecodable`)."""
        return self._undecodable

    def get_state(self) -> dict:
        """JSON-able state, identical on every process; pass to set_state (or start_step) to resume exactly. A
        bucket stream adds its process count and each process's position (examples it consumed)."""
        state = {"version": STATE_VERSION, "step": self._step, "seed": self.seed, "fraction": self.fraction,
                 "global_batch_size": self.global_batch_size, "split": self.split, "dataset": self.dataset_name}
        if self.repeats > 1:  # absent when off, so states saved before the option existed compare equal
            state["repeats"] = self.repeats
        return {**state, **self.plan.state(self._step)}

    def explain_resume(self, saved: dict) -> str | None:
        """One line (logged by process 0) when resuming from `saved` does not continue exactly; else None."""
        line = self.plan.explain_resume(saved, self._step)
        if line and jax.process_index() == 0:
            log.warning(line)
        return line

    def set_state(self, state: dict) -> None:
        """Continues from a state saved by get_state() (on any topology)."""
        mine = self.get_state()
        for key in ("seed", "fraction", "global_batch_size", "split", "repeats"):
            if state.get(key) != mine.get(key):
                raise ValueError(f"iterator state has {key}={state.get(key)!r} but this iterator has "
                                 f"{mine.get(key)!r}: build the iterator with the saved settings")
        self._reset(int(state["step"]))

    def close(self) -> None:
        """Stops the workers: queued chunks are dropped, running ones end after their current example."""
        self._reset(self._step)
        self._workers.shutdown(wait=True, cancel_futures=True)
        self._assembler.shutdown(wait=True, cancel_futures=True)
        self.plan.close()

    def __enter__(self) -> "BatchIterator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        if self._end is None:
            raise TypeError("a train iterator is endless")
        return self._end - self._step


def train_iterator(ds: Dataset, split: str = "train", pp: str = "decode|value_range(-1,1)", *,
                   global_batch_size: int, sharding, seed: int = 0, start_step: int = 0, fraction: float = 1.0,
                   num_workers: int | None = None, prefetch: int = 2, state: dict | None = None,
                   stream: dict | None = None, repeats: int = 1) -> BatchIterator:
    """Endless shuffled training batches (dict of global jax.Arrays) starting at `start_step` (or `state`).
    `stream`: window and read_ahead of a bucket stream (stream_plan.StreamPlan). `repeats` > 1: repeated
    augmentation, each image that many times per global batch (repeated.py)."""
    it = BatchIterator(ds, split, pp, global_batch_size, sharding, train=True, seed=seed, fraction=fraction,
                       start_step=start_step, end_step=None, num_workers=num_workers, prefetch=prefetch,
                       stream=stream, repeats=repeats)
    if state is not None:
        it.set_state(state)
    return it


def eval_iterator(ds: Dataset, split: str = "test", pp: str = "decode|value_range(-1,1)", *,
                  global_batch_size: int, sharding, seed: int = 0, num_workers: int | None = None,
                  prefetch: int = 2) -> BatchIterator:
    """One pass over the split in order; `_mask` is 1 for real rows, 0 for the padding of the last batch and for
    undecodable records (counted in `num_undecodable`)."""
    return BatchIterator(ds, split, pp, global_batch_size, sharding, train=False, seed=seed, fraction=1.0,
                         start_step=0, end_step=None, num_workers=num_workers, prefetch=prefetch)
