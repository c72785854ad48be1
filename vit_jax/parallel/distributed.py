"""Multi-process start-up: explicit coordinator, or auto-detection of TPU pods and SLURM jobs; then failure handling.

`VIT_JAX_DISTRIBUTED` (set by the launchers in launch/) overrides the detection: `auto` always calls
`jax.distributed.initialize()` and lets JAX read the cluster (TPU VM metadata, SLURM_*, Open MPI), which matters on
TPU VM pods where the ssh environment carries no TPU_* variables; `off` never does.
"""

from __future__ import annotations

import os

import jax

ENV_SWITCH = "VIT_JAX_DISTRIBUTED"


def cluster_detected() -> str | None:
    """Name of the multi-process environment JAX can configure itself from, or None on a single host."""
    switch = os.environ.get(ENV_SWITCH, "").strip().lower()
    if switch == "off":
        return None
    if switch == "auto":
        return "auto"
    if switch:
        raise ValueError(f"{ENV_SWITCH}={switch!r} is not valid; use 'auto', 'off' or leave it unset")
    if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_JOB_ID" in os.environ:
        return "slurm"
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if "," in hosts or os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "tpu"
    return None


def initialize(coordinator: str = "", num_processes: int = 0, process_id: int = -1,
               heartbeat_timeout_s: int = 30, initialization_timeout_s: int = 300, *, watchdog: bool = True) -> bool:
    """Starts jax.distributed when this is a multi-process job; returns whether it did.

    Must run before any JAX computation. With more than one process it also starts vit_jax.parallel.watchdog:
    when a process dies or raises, every process exits non-zero within about `heartbeat_timeout_s` with a
    message naming it, instead of hanging in a collective. JAX's own heartbeat timeout T then becomes a backstop,
    3 * heartbeat_timeout_s + 10: JAX declares a process dead between T/2 and T after its death (measured: its
    heartbeats are T/2 apart), so it must not cut in while the watchdog stops the job cleanly.
    """
    jax_heartbeat = 3 * int(heartbeat_timeout_s) + 10 if watchdog else int(heartbeat_timeout_s)
    kw = dict(heartbeat_timeout_seconds=jax_heartbeat, initialization_timeout=int(initialization_timeout_s))
    if coordinator:
        if num_processes <= 0 or process_id < 0:
            raise ValueError("distributed.coordinator needs distributed.num_processes and distributed.process_id")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id, **kw)
    elif (kind := cluster_detected()) is not None:
        try:
            jax.distributed.initialize(**kw)
        except ValueError as e:
            if kind != "auto":
                raise
            raise RuntimeError(f"{ENV_SWITCH}=auto but JAX found no cluster to join ({e}); unset {ENV_SWITCH} "
                               "or pass --config.distributed.coordinator") from e
    else:
        return False
    if watchdog:
        from vit_jax.parallel import watchdog as watchdog_lib

        watchdog_lib.start(lost_after_s=heartbeat_timeout_s)
    return True


def barrier(name: str, timeout_s: float) -> None:
    """Waits until every process reaches `name`, through JAX's coordination service (no-op with one process).

    Unlike multihost_utils.sync_global_devices this runs no device collective: it can precede a job's first
    collective on a set of devices, whose gloo context every process must join within a fixed 30 s on CPU.
    """
    from jax._src import distributed  # the client JAX created; there is no public accessor

    client = distributed.global_state.client
    if client is not None and jax.process_count() > 1:
        client.wait_at_barrier(name, int(timeout_s * 1000))
