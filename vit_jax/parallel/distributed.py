"""Multi-process start-up: explicit coordinator, or auto-detection of TPU pods and SLURM jobs; then failure handling.

`VIT_JAX_DISTRIBUTED` (set by the launchers in launch/) overrides the detection: `auto` always calls
`jax.distributed.initialize()` and lets JAX read the cluster (TPU VM metadata, SLURM_*, Open MPI), which matters on
TPU VM pods where the ssh environment carries no TPU_* variables; `off` never does.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

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


_BARRIERS = itertools.count()


def barrier(name: str, timeout_s: float = 1800) -> None:
    """Every process of the job reaches this point before any goes on (a no-op for one process).

    Uses the coordination service's barrier, not a device collective: gloo gives the first collective of a
    device set only 30 s for all processes to arrive, which a peer still compiling on a loaded host can exceed.
    All processes must call the same barriers in the same order (the ids count calls).
    """
    if jax.process_count() == 1:
        return
    from jax._src import distributed  # the client JAX created; there is no public accessor

    distributed.global_state.client.wait_at_barrier(f"vit_jax/{next(_BARRIERS)}/{name}",
                                                    timeout_in_ms=int(timeout_s * 1000))


def all_processes(value: str, timeout_s: float = 1800) -> list[str]:
    """Every process's `value`, in process order (one process: [value]); through the coordination service's
    key-value store, so it works before (and without) any device collective."""
    if jax.process_count() == 1:
        return [value]
    from jax._src import distributed

    client = distributed.global_state.client
    key = f"vit_jax/{next(_BARRIERS)}/gather"
    client.key_value_set(f"{key}/{jax.process_index()}", value)
    barrier("gathered", timeout_s)
    got = {int(k.rsplit("/", 1)[1]): v for k, v in client.key_value_dir_get(f"{key}/")}
    return [got[i] for i in range(jax.process_count())]


def compile_synced(jitted: Any, *args: Any, name: str = "step") -> Any:
    """`jitted.lower(*args).compile()`, then a barrier: the first run of the compiled program (and of its
    collectives) starts on every process together, however long each took to compile."""
    compiled = jitted.lower(*args).compile()
    barrier(f"compiled {name}")
    return compiled


class SyncedJit:
    """A jitted function whose first call for each input signature compiles, waits for every process to have
    compiled (`compile_synced`), then runs; later calls reuse that executable. One process: the jitted function."""

    def __init__(self, jitted: Any, name: str):
        self.jitted, self.name = jitted, name
        self._compiled: dict[Any, Any] = {}

    def __call__(self, *args: Any) -> Any:
        if jax.process_count() == 1:
            return self.jitted(*args)
        leaves, tree = jax.tree.flatten(args)
        key = (tree, tuple((x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves))
        if key not in self._compiled:
            self._compiled[key] = compile_synced(self.jitted, *args, name=self.name)
        return self._compiled[key](*args)

    def __getattr__(self, name: str) -> Any:  # lower, trace, ...: the jitted function's
        return getattr(self.jitted, name)
