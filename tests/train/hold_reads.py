"""The trainer, except that Orbax's reads of checkpoint step $HOLD_STEP's arrays never complete once read: they stay
pending until a read of that step fails, as reads on a loaded machine or a slow disk are still in flight when a damaged
file fails a restore (the case that printed ~20 "Exception ignored in: <coroutine ...>" tracebacks). A read of any
other step is untouched. At exit it prints how many reads it held and how many the trainer found abandoned, so a test
knows the case happened. Takes the same arguments as `python -m vit_jax.main`.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import sys

from orbax.checkpoint._src.serialization import serialization

from vit_jax import main as main_lib
from vit_jax.checkpoints import training

HOLD = f"/checkpoints/{os.environ['HOLD_STEP']}/"
HOLD_LIMIT_S = 120  # a step that restores after all (the damage missed) must not hang the test
held = 0
_read_shard = serialization._read_shard


async def _held_read_shard(*args, **kwargs):
    global held
    out = await _read_shard(*args, **kwargs)
    tensorstore = kwargs.get("t", args[0] if args else None)
    if HOLD in str(tensorstore.spec()):
        held += 1
        await asyncio.sleep(HOLD_LIMIT_S)
    return out


def _report() -> None:
    print(f"hold_reads: held {held} read(s); {training.ABANDONED_READS} abandoned read(s) finalized", flush=True)


serialization._read_shard = _held_read_shard
atexit.register(_report)

if __name__ == "__main__":
    sys.exit(main_lib.main([sys.argv[0], *sys.argv[1:]]))
