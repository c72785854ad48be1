"""TensorBoard event files without TensorFlow: scalars, written as TensorBoard reads them.

An event file is a sequence of TFRecord-framed `Event` protos (the first carries the file version): each record is
its length (uint64, little-endian), the masked CRC-32C of those 8 bytes, the serialised proto, and its masked
CRC-32C. The protos are tensorboard's own (`tensorboard.compat.proto`), CRC-32C is google-crc32c's.

Why not clu's or tf.summary's writer: both import TensorFlow, which costs every training process seconds of start-up
(more than JAX's own import on a 2-core machine) for nothing else a run needs.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time

import google_crc32c
from tensorboard.compat.proto import event_pb2, summary_pb2

_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask: rotate right by 15 bits, add this constant
_opened = itertools.count()  # writers opened by this process: two in one second still get two files


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the data, its masked CRC."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


class EventFileWriter:
    """Scalars into `logdir/events.out.tfevents.<time>.<host>.<pid>.<n>.v2`, one file per writer (per run segment)."""

    def __init__(self, logdir: str) -> None:
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.{next(_opened)}.v2"
        self.path = os.path.join(logdir, name)
        self._file = open(self.path, "ab")
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event: event_pb2.Event) -> None:
        self._file.write(record(event.SerializeToString()))

    def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
        values = [summary_pb2.Summary.Value(tag=tag, simple_value=float(v)) for tag, v in scalars.items()]
        self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values)))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
