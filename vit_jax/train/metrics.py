"""Metric writing (TensorBoard via clu + a JSON-lines file), hardware peak FLOP/s for MFU, and compute accounting."""

from __future__ import annotations

import json
import os
import resource
import shutil
import time
from typing import Any

import jax
import numpy as np
from etils import epath

from vit_jax import hardware
from vit_jax.storage import scratch
from vit_jax.train import workdir as wd

# (device_kind substring, value) per JAX device, derived from the one hardware table (vit_jax.hardware); the first key
# contained in a device kind wins. Dense bf16 peak FLOP/s for MFU, and TensorCores per device for TPU-core-days (the
# ViT paper's compute unit): v5e reports "TPU v5 lite" (one core), v5p "TPU v5" (two cores, one megacore device).
PEAK_FLOPS = tuple((kind, a.device_peak_flops) for a in hardware.ACCELERATORS for kind in a.kinds)
TPU_CORES = tuple((kind, a.tensorcores_per_device) for a in hardware.ACCELERATORS if a.is_tpu for kind in a.kinds)


def table_lookup(table, kind: str):
    for key, value in table:
        if key.lower() in kind.lower():
            return value
    return None


# On a CPU there is no published peak: MFU is taken against an n x n fp32 matmul measured in the same process, by the
# trainer (metrics.jsonl) and by `vit-jax bench` alike, so their MFUs compare. 2048 keeps the trainer's start-up
# cheap (four matmuls of 17 GFLOP); the recorded CPU benchmarks of docs/BENCHMARKS.md name their --reference-n.
CPU_REFERENCE_N = 2048


def cpu_seconds() -> float:
    """CPU seconds of this process so far (all threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class MatmulReference:
    """An n x n fp32 matmul on the first device: the CPU 'peak' that MFU is measured against."""

    def __init__(self, n: int = CPU_REFERENCE_N):
        self.n = n
        self.flops = 2.0 * n**3
        self._a = jax.random.normal(jax.random.key(0), (n, n), jax.numpy.float32)
        # The result is written into a donated buffer: a fresh n x n output every call (64 MiB at 4096) would be
        # page-faulted in by the kernel (glibc hands allocations that large straight back to the OS), costing ~30%
        # of the matmul rate at 4096.
        self._f = jax.jit(lambda x, out: x @ x, donate_argnums=1, keep_unused=True)
        self._out = self._f(self._a, jax.numpy.zeros((n, n), jax.numpy.float32))
        self._out.block_until_ready()

    def time(self) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) of one matmul."""
        wall, cpu = time.perf_counter(), cpu_seconds()
        self._out = self._f(self._a, self._out)
        self._out.block_until_ready()
        return time.perf_counter() - wall, cpu_seconds() - cpu


def measure_cpu_matmul_flops(n: int = CPU_REFERENCE_N, repeats: int = 3) -> float:
    """Achieved FLOP/s of the reference matmul on this CPU, measured now (the best of `repeats`)."""
    reference = MatmulReference(n)
    return reference.flops / min(reference.time()[0] for _ in range(repeats))


_CPU_PEAK: list[tuple[float, str]] = []  # measured once per process (each measurement costs ~1 s of start-up)
# The measured figure is shared through the compilation cache folder by the runs of one machine for this long: a sweep,
# a queue of jobs or a test session then compares its MFUs against one reference instead of each run's own noisy
# draw, and each run saves the measurement (~0.7-1 s of CPU at start-up; the test suite starts ~50 trainers). An
# hour, not a day: this kind of machine's speed moves from day to day.
CPU_PEAK_SHARE_S = 3600.0
CPU_PEAK_FILE = "vit_jax_cpu_peak.json"


def _cpu_identity(n: int) -> dict:
    """What a shared CPU measurement must match: the CPU model, the cores this process may use, its CPU devices."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": hardware.cpu_model(), "cores": cores, "devices": jax.local_device_count(), "n": n,
            "jax": jax.__version__}


def shared_cpu_peak(cache_dir: str | None, n: int = CPU_REFERENCE_N, measure=None,
                    now: float | None = None) -> tuple[float, str]:
    """(FLOP/s of the n x n reference matmul, where it comes from): the figure another run of this machine measured
    in the last CPU_PEAK_SHARE_S seconds (kept in `cache_dir`), else measured now and kept there for the next runs.
    An unreadable or foreign file is measured over; a folder that cannot be written just is not shared."""
    measure = measure or (lambda: measure_cpu_matmul_flops(n))
    now = time.time() if now is None else now
    identity = _cpu_identity(n)
    path = os.path.join(cache_dir, CPU_PEAK_FILE) if cache_dir else None
    if path:
        try:
            with open(path) as f:
                saved = json.load(f)
            age = now - float(saved["measured_at"])
            if saved["identity"] == identity and 0 <= age <= CPU_PEAK_SHARE_S and float(saved["flops"]) > 0:
                return float(saved["flops"]), f"fp32 {n}^2 matmul measured {age / 60:.0f} min ago by a run of " \
                                              "this machine"
        except (OSError, ValueError, KeyError, TypeError):
            pass
    flops = float(measure())
    if path:
        try:
            # atomic (wd.write_bytes): concurrent runs read a whole file or none
            wd.write_bytes(epath.Path(path), json.dumps({"identity": identity, "flops": flops,
                                                              "measured_at": now}).encode())
        except OSError:
            pass
    return flops, f"measured fp32 {n}^2 matmul"


def device_peak_flops(device=None) -> tuple[float, str]:
    """(peak FLOP/s per device, where the number comes from). On a CPU, the reference matmul measured by this
    machine's runs within the hour (shared_cpu_peak), once per process: later runs in the same process (a notebook,
    a test session) reuse that figure."""
    device = device or jax.devices()[0]
    if device.platform == "cpu":
        if not _CPU_PEAK:
            _CPU_PEAK.append(shared_cpu_peak(jax.config.jax_compilation_cache_dir))
        return _CPU_PEAK[0]
    peak = table_lookup(PEAK_FLOPS, device.device_kind)
    if peak is None:
        return float("nan"), f"unknown device kind {device.device_kind!r}"
    return peak, f"{device.device_kind} dense bf16 peak"


class MetricWriter:
    """TensorBoard events (train/tb_events.py) and `metrics.jsonl`, by process 0 only; other processes just log.

    A resumed run at `resume_step` first drops the lines logged after that step by the interrupted segment (it
    trains those steps again), so every step appears once. Locally, lines are appended and events written in place.
    In a bucket (no append; one request per write): lines are kept in memory and `metrics.jsonl` is rewritten whole
    by `flush()`, and TensorBoard writes to a local mirror folder whose changed event files `flush()` uploads whole
    (tf.summary's own gs:// writer goes through tf.io.gfile, which only reaches real GCS). `write()` flushes at most
    every `flush_interval_s`; the trainer also flushes before every checkpoint, so the lines of every step up to a
    checkpoint are in the bucket before it is, and a crash loses only lines that the resumed run writes again.
    """

    def __init__(self, workdir: str, enabled: bool, resume_step: int = 0, flush_interval_s: float = 30.0):
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        from vit_jax.train.tb_events import EventFileWriter

        self._local = wd.is_local(workdir)
        self._tb_dir = wd.path(workdir, "tb")
        self._mirror = None if self._local else scratch.make_private_dir("vit_jax_tb_")
        self._uploaded: dict[str, int] = {}
        self._flush_interval_s = flush_interval_s
        self._flushed_at = time.monotonic()
        self._dirty = False
        wd.path(workdir).mkdir(parents=True, exist_ok=True)
        self._tb = EventFileWriter(self._mirror or str(self._tb_dir))
        self._path = wd.path(workdir, "metrics.jsonl")
        self._lines = self._path.read_text().splitlines(True) if self._path.exists() else []
        kept = [line for line in self._lines if line.strip() and json.loads(line)["step"] <= resume_step]
        if len(kept) != len(self._lines):
            wd.write_bytes(self._path, "".join(kept).encode())
        self._lines = [] if self._local else kept

    def write(self, step: int, scalars: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in scalars.items() if v is not None and np.ndim(v) == 0}
        self._tb.write_scalars(step, clean)
        line = json.dumps({"step": int(step), **{k: _json_float(v) for k, v in clean.items()}}) + "\n"
        if self._local:
            with open(self._path, "a") as f:
                f.write(line)
            return
        self._lines.append(line)
        self._dirty = True
        if time.monotonic() - self._flushed_at >= self._flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Makes everything written so far durable: in a bucket, rewrites metrics.jsonl and uploads new events."""
        if self.enabled:
            self._tb.flush()
            self._sync()

    def _sync(self) -> None:
        if self._local:
            return
        if self._dirty:
            wd.write_bytes(self._path, "".join(self._lines).encode())
            self._dirty = False
        for name in sorted(os.listdir(self._mirror)):
            size = os.path.getsize(os.path.join(self._mirror, name))
            if self._uploaded.get(name) != size:
                with open(os.path.join(self._mirror, name), "rb") as f:
                    wd.write_bytes(self._tb_dir / name, f.read())
                self._uploaded[name] = size
        self._flushed_at = time.monotonic()

    def close(self) -> None:
        if self.enabled:
            self._tb.close()
            self._sync()
            if self._mirror:
                shutil.rmtree(self._mirror, ignore_errors=True)


def _json_float(v: float):
    return v if np.isfinite(v) else str(v)


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
