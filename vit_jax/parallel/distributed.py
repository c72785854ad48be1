"""Multi-process start-up: explicit coordinator, or auto-detection of TPU pods and SLURM jobs."""

from __future__ import annotations

import os

import jax


def cluster_detected() -> str | None:
    """Name of the multi-process environment JAX can configure itself from, or None on a single host."""
    if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_JOB_ID" in os.environ:
        return "slurm"
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if "," in hosts or os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "tpu"
    return None


def initialize(coordinator: str = "", num_processes: int = 0, process_id: int = -1,
               heartbeat_timeout_s: int = 30, initialization_timeout_s: int = 300) -> bool:
    """Starts jax.distributed when this is a multi-process job; returns whether it did.

    Must run before any JAX computation. A short heartbeat timeout makes survivors notice a dead peer quickly
    (they then fail instead of hanging in a collective).
    """
    kw = dict(heartbeat_timeout_seconds=int(heartbeat_timeout_s), initialization_timeout=int(initialization_timeout_s))
    if coordinator:
        if num_processes <= 0 or process_id < 0:
            raise ValueError("distributed.coordinator needs distributed.num_processes and distributed.process_id")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id, **kw)
        return True
    if cluster_detected():
        jax.distributed.initialize(**kw)
        return True
    return False
