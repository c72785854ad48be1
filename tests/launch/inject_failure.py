"""The trainer, except that process $FAIL_PROCESS raises RuntimeError when it asks for training batch $FAIL_AT_BATCH
(0: never), and, when $TERMINATE_WHEN names a file, a native thread calls std::terminate once that file exists.

Used by the failure-handling tests to make one process of a job fail in Python (the case where, without
vit_jax.parallel.watchdog, the whole job hangs), and a survivor of a killed peer end as Gloo ends it when the peer
vanished mid-collective (an exception escaping Gloo's network thread: std::terminate, which aborts the process
unless the watchdog's guard holds it for the verdict; which thread of a real survivor meets the broken message, and
when, is down to the schedule). Takes the same arguments as `python -m vit_jax.main`.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

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


def terminate_from_a_native_thread_when(path: str) -> None:
    """Once `path` exists: std::terminate on a thread Python does not know, as Gloo's network thread would."""
    while not os.path.exists(path):
        time.sleep(0.05)
    libc = ctypes.CDLL(None)
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    terminate = ctypes.cast(ctypes.CDLL("libstdc++.so.6")["_ZSt9terminatev"], ctypes.c_void_p)
    print("inject_failure: std::terminate on a native thread", flush=True)
    libc.pthread_create(ctypes.byref(ctypes.c_ulong()), None, terminate, None)


def main() -> int:
    if os.environ.get("TERMINATE_WHEN"):
        threading.Thread(target=terminate_from_a_native_thread_when, args=(os.environ["TERMINATE_WHEN"],),
                         daemon=True).start()
    real = pipeline.train_iterator
    process, fail_at = int(os.environ.get("FAIL_PROCESS", "1")), int(os.environ.get("FAIL_AT_BATCH", "10"))
    pipeline.train_iterator = lambda *a, **kw: FailingIterator(real(*a, **kw), process, fail_at)
    return main_lib.main([sys.argv[0], *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
