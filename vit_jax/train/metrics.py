"""Metric writing (TensorBoard via clu + a JSON-lines file), hardware peak FLOP/s for MFU, and compute accounting."""

from __future__ import annotations

import json
import time
from typing import Any

import jax
import numpy as np

from vit_jax import hardware

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


def measure_cpu_matmul_flops(n: int = 2048, repeats: int = 3) -> float:
    """Achieved FLOP/s of an n x n fp32 matmul on this CPU, measured now: the CPU 'peak' MFU is taken against."""
    a = jax.random.normal(jax.random.key(0), (n, n), jax.numpy.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best


def device_peak_flops(device=None) -> tuple[float, str]:
    """(peak FLOP/s per device, where the number comes from)."""
    device = device or jax.devices()[0]
    if device.platform == "cpu":
        return measure_cpu_matmul_flops(), "measured fp32 2048^2 matmul"
    peak = table_lookup(PEAK_FLOPS, device.device_kind)
    if peak is None:
        return float("nan"), f"unknown device kind {device.device_kind!r}"
    return peak, f"{device.device_kind} dense bf16 peak"


class MetricWriter:
    """TensorBoard events (clu) plus `metrics.jsonl`, written by process 0 only; other processes just log.

    Locally the JSON lines are appended; on a bucket (no append there) the file is rewritten whole at each write.
    A run resumed at `resume_step` first drops the lines logged after that step by the interrupted segment (it
    trains those steps again), so every step appears once.
    """

    def __init__(self, workdir: str, enabled: bool, resume_step: int = 0):
        self.enabled = enabled
        self._tb = None
        if enabled:
            from clu import metric_writers

            from vit_jax.train import workdir as wd

            wd.path(workdir).mkdir(parents=True, exist_ok=True)
            self._tb = metric_writers.create_default_writer(str(wd.path(workdir, "tb")), asynchronous=True)
            self._path = wd.path(workdir, "metrics.jsonl")
            self._local = wd.is_local(workdir)
            self._lines = self._path.read_text().splitlines(True) if self._path.exists() else []
            kept = [line for line in self._lines if line.strip() and json.loads(line)["step"] <= resume_step]
            if len(kept) != len(self._lines):
                self._path.write_text("".join(kept))
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
        else:
            self._lines.append(line)
            self._path.write_text("".join(self._lines))

    def close(self) -> None:
        if self.enabled:
            self._tb.flush()
            self._tb.close()


def _json_float(v: float):
    return v if np.isfinite(v) else str(v)


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def read_jsonl(path) -> list[dict]:
    from etils import epath

    path = epath.Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
