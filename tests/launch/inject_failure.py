"""The trainer, except that process $FAIL_PROCESS raises RuntimeError when it asks for training batch $FAIL_AT_BATCH.

Used by the failure-handling tests to make one process of a job fail in Python (the case where, without
vit_jax.parallel.watchdog, the whole job hangs). Takes the same arguments as `python -m vit_jax.main`.
"""

from __future__ import annotations

import os
import sys

import jax

from vit_jax import main as main_lib
from vit_jax.data import pipeline


class FailingIterator:
    """Delegates to the real batch iterator; raises on batch number `fail_at` in process `process`."""

    def __init__(self, it, process: int, fail_at: int):
        self._it, self._process, self._fail_at, self._count = it, process, fail_at, 0

    def __iter__(self):
        return self

    def __next__(self):
        self._count += 1
        if self._count == self._fail_at and jax.process_index() == self._process:
            raise RuntimeError(f"injected failure at batch {self._count}")
        return next(self._it)

    def __getattr__(self, name):
        return getattr(self._it, name)


def main() -> int:
    real = pipeline.train_iterator
    process, fail_at = int(os.environ.get("FAIL_PROCESS", "1")), int(os.environ.get("FAIL_AT_BATCH", "10"))
    pipeline.train_iterator = lambda *a, **kw: FailingIterator(real(*a, **kw), process, fail_at)
    return main_lib.main([sys.argv[0], *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
