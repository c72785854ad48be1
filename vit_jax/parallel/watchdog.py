"""Failure handling across the processes of one job: when a process dies or fails, every other process stops within
about `heartbeat_timeout_s`, non-zero, with a message naming the lost process, instead of hanging in a collective.

What JAX (0.10, measured on CPU with gloo) does on its own, and the gaps this module closes:

- A process is SIGKILLed (OOM killer, lost host): the coordination service notices its missing heartbeats and
  *aborts* every survivor (SIGABRT from a C++ thread, exit -6, possibly a core dump) with "tasks are unhealthy
  (stopped sending heartbeats): N" buried in a stack dump. Here process 0 notices first (distributed.initialize
  makes JAX's own timeout a later backstop) and every process exits with LOST_PEER_EXIT_CODE and
  "lost peer process N (host)". Gloo may abort a survivor first (std::terminate on its network thread, "768 vs 4",
  when the peer vanished mid-collective): a terminate handler holds that thread for the verdict (_on_terminate).
- Process 0, which hosts the coordination service, dies: JAX aborts the others at once ("leader task ... died").
  Nothing to add; it is fast.
- A Python exception in one process: it prints the traceback, then blocks in JAX's exit-time shutdown barrier for
  up to 5 minutes while its peers wait in a collective for it: the whole job hangs. Here the failing process
  publishes its error and leaves at once (os._exit), and its peers stop with "process N (host) failed: <error>".

Mechanism: a daemon thread per process, on the coordination service's key-value store (no extra ports):
every `interval_s` each process bumps its counter `vit_jax_watchdog/beat/<id>` and looks for a verdict under
`vit_jax_watchdog/verdict/`; process 0 also reads all counters and, when one has not moved for `lost_after_s`, posts
the verdict. A process that exits normally marks itself done first, so finishing at different times is no failure.
Cost: two small RPCs per process per interval; the interval grows with the process count (1 s up to 100 processes).

A launcher that decides from each process's exit status (launch/slurm.py: srun reports only the highest, and kills
the other tasks as soon as one exits non-zero) sets VIT_JAX_EXIT_FILE: a process that stops the job writes the code
it will exit with there *before* telling its peers, so a failing process that is killed while it waits for them to
read its error is still recorded as failed, not as lost.
"""

from __future__ import annotations

import atexit
import os
import re
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable

# EX_TEMPFAIL: a peer was lost, this process is healthy; relaunching the job resumes from its last checkpoint.
LOST_PEER_EXIT_CODE = 75
FAILED_EXIT_CODE = 1

PREFIX = "vit_jax_watchdog"
EXIT_FILE_ENV = "VIT_JAX_EXIT_FILE"


def _say(msg: str) -> None:
    print(f"vit_jax watchdog: {msg}", file=sys.stderr, flush=True)


def record_exit(code: int) -> None:
    """Writes the exit status this process is about to leave with to $VIT_JAX_EXIT_FILE, if a launcher set it."""
    path = os.environ.get(EXIT_FILE_ENV)
    if not path:
        return
    try:
        with open(path, "w") as f:
            f.write(f"{code}\n")
    except OSError as e:  # the launcher then sees only how the process ended
        _say(f"could not record exit code {code} in {path} ({e.__class__.__name__})")


class PeerWatchdog:
    """Liveness of the peers of one multi-process job; see the module docstring.

    `client` is JAX's distributed runtime client (key_value_set / key_value_dir_get). `clock`, `sleep` and `exit`
    are injectable so the logic can be tested without processes.
    """

    def __init__(self, client: Any, process_id: int, num_processes: int, *, lost_after_s: float,
                 interval_s: float | None = None, coordinator: str = "",
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 exit: Callable[[int], None] = os._exit):
        self.client = client
        self.process_id = process_id
        self.num_processes = num_processes
        self.lost_after_s = float(lost_after_s)
        # Many processes: poll less often so process 0's coordination service sees ~100 RPCs/s at most.
        self.interval_s = interval_s or min(self.lost_after_s / 4, max(1.0, num_processes / 100))
        self.coordinator = coordinator
        self.clock, self.sleep, self.exit = clock, sleep, exit
        self.host = f"{socket.gethostname()}, pid {os.getpid()}"
        self._beats = 0
        self._last_loop: float | None = None
        self._seen: dict[int, tuple[str, float]] = {}  # peer -> (last counter value, when it last changed)
        self._hosts: dict[int, str] = {}
        self._rpc_errors = 0
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- keys ---------------------------------------------------------------------------------------------------------
    def _set(self, kind: str, value: str, pid: int | None = None) -> None:
        self.client.key_value_set(f"{PREFIX}/{kind}/{self.process_id if pid is None else pid}", value,
                                  allow_overwrite=True)

    def _dir(self, kind: str) -> dict[int, str]:
        return {int(k.rsplit("/", 1)[1]): v for k, v in self.client.key_value_dir_get(f"{PREFIX}/{kind}/")}

    def describe(self, pid: int) -> str:
        """'process N (host, pid P)' for messages; the host part is known once the peer has published it."""
        if pid not in self._hosts:
            try:
                self._hosts.update(self._dir("info"))
            except Exception:  # noqa: BLE001 - only decoration of a message
                pass
        return f"process {pid} ({self._hosts[pid]})" if pid in self._hosts else f"process {pid}"

    # -- lifecycle ----------------------------------------------------------------------------------------------------
    def start(self) -> "PeerWatchdog":
        self._set("info", self.host)
        self._thread = threading.Thread(target=self._run, name="vit_jax_watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    @property
    def verdict_wait_s(self) -> float:
        """How long a verdict can take: the heartbeat timeout, process 0's poll, then ours (with slack)."""
        return self.lost_after_s + 4 * self.interval_s + 5

    def await_verdict(self) -> None:
        """Blocks while the watchdog thread looks for a lost peer (it exits the process when it finds one); returns
        after verdict_wait_s if it found none."""
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(self.verdict_wait_s)

    def mark_done(self) -> None:
        """This process is exiting normally: peers must not read its silence as a failure."""
        self.stop()
        try:
            self._set("done", "1")
        except Exception:  # noqa: BLE001 - exiting anyway; at worst a peer reports us lost
            pass

    def report_failure(self, message: str, code: int = FAILED_EXIT_CODE) -> None:
        """Publishes `message` as the job's verdict, gives the peers time to read it, and exits with `code`."""
        self.stop()
        _say(message)
        record_exit(code)  # first: once the peers read the verdict, they exit, and a launcher may kill us
        try:
            self._set("verdict", message)
        except Exception as e:  # noqa: BLE001 - the peers will still see our heartbeat stop
            _say(f"could not tell the other processes ({e.__class__.__name__})")
        # Process 0 hosts the coordination service: leaving at once would cut the peers off before they read it.
        self.sleep(2 * self.interval_s + 0.5)
        self.exit(code)

    # -- the loop -----------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped.is_set():
            self.check_once()
            self.sleep(self.interval_s)

    def check_once(self) -> None:
        """One heartbeat and one look at the job's state; exits the process when a peer is lost."""
        now = self.clock()
        try:
            self._beats += 1
            self._set("beat", str(self._beats))
            verdicts = self._dir("verdict")
            observed = self._observe(now) if self.process_id == 0 else None
            self._rpc_errors = 0
        except Exception as e:  # noqa: BLE001 - any RPC failure means the coordination service is unreachable
            if self._stopped.is_set():
                return
            self._rpc_errors += 1
            if self._rpc_errors >= 2:
                self.stop()
                _say(f"lost the coordinator (process 0 at {self.coordinator or '?'}): {str(e).splitlines()[0]}; "
                     f"exiting with code {LOST_PEER_EXIT_CODE}")
                self.exit(LOST_PEER_EXIT_CODE)
            return
        others = {p: v for p, v in verdicts.items() if p != self.process_id}
        if others:
            self.stop()
            _say(f"stopping process {self.process_id}: {others[min(others)]}; exiting with code {LOST_PEER_EXIT_CODE}")
            if self.process_id == 0:  # the others read the verdict from our coordination service: let them
                self.sleep(2 * self.interval_s + 0.5)
            self.exit(LOST_PEER_EXIT_CODE)
        elif observed:
            self.report_failure(observed, LOST_PEER_EXIT_CODE)

    def _observe(self, now: float) -> str | None:
        """Process 0: the verdict for a peer whose counter has not moved for lost_after_s, if any."""
        # If this thread itself did not run for a long while (GIL held, machine suspended), stale counters prove
        # nothing about the peers: restart every clock instead of blaming them.
        starved = self._last_loop is not None and now - self._last_loop > self.lost_after_s / 2
        self._last_loop = now
        beats, done = self._dir("beat"), self._dir("done")
        for pid in range(self.num_processes):
            if pid == self.process_id or pid in done:
                continue
            value = beats.get(pid, "")
            last = self._seen.get(pid)
            if last is None or last[0] != value or starved:
                self._seen[pid] = (value, now)
            elif now - last[1] > self.lost_after_s:
                return (f"lost peer {self.describe(pid)}: no heartbeat for {now - last[1]:.0f}s (killed, out of "
                        "memory, or its host is down); relaunch the job to resume from its last checkpoint")
        return None


# ---------------------------------------------------------------------------------------------------------------------
_ACTIVE: PeerWatchdog | None = None


def active() -> PeerWatchdog | None:
    """The watchdog of this process, if multi-process failure handling is on."""
    return _ACTIVE


def fail_fast(exc: BaseException) -> None:
    """In a multi-process job: print `exc` with its traceback, tell the peers, exit non-zero; never returns there.

    Without a watchdog (single process) it returns and the caller re-raises. Call it from an `except` clause that
    would otherwise run cleanup (checkpoint waits, iterator shutdown) needing peers that are stuck waiting for us.
    """
    from vit_jax.errors import UserError, debug_enabled, one_line

    w = _ACTIVE
    if w is None:
        return
    if looks_like_lost_peer(exc):
        # A collective failed because a peer vanished (gloo: "Connection reset by peer"): this process is healthy,
        # and blaming itself would hide the root cause. The watchdog thread names the lost peer and exits with
        # LOST_PEER_EXIT_CODE once its heartbeat is overdue; if that never happens, the failure was ours after all.
        _say(f"a collective failed ({one_line(exc)[:200]}); waiting up to {w.verdict_wait_s:.0f}s to learn which "
             "process was lost")
        w.await_verdict()
    user_error = isinstance(exc, UserError)
    if not user_error or debug_enabled():  # a user's mistake is its one line; a bug keeps its traceback
        traceback.print_exception(exc)
        sys.stderr.flush()
    code = exc.exit_code if user_error else FAILED_EXIT_CODE
    w.report_failure(f"{w.describe(w.process_id)} failed: {type(exc).__name__}: {one_line(exc)[:300]}", code)


_LOST_PEER_SIGNS = re.compile(r"[Gg]loo|Connection (reset|closed|refused)|Broken pipe|[Ss]ocket closed|"
                              r"UNAVAILABLE|DEADLINE_EXCEEDED|heartbeat|unhealthy")


def looks_like_lost_peer(exc: BaseException) -> bool:
    """A JAX runtime error from cross-process communication (what a dead peer looks like from a live one), itself
    or as the cause of `exc`: a checkpoint save whose all-gather lost its peer is a CheckpointSaveError from it."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and _LOST_PEER_SIGNS.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _excepthook(exc_type, exc, tb) -> None:
    # Reached by an exception nobody caught; JAX's exit-time shutdown barrier would otherwise hang this process.
    fail_fast(exc.with_traceback(tb) if exc is not None else exc_type())
    sys.__excepthook__(exc_type, exc, tb)


# std::terminate's handler before ours, and ours (kept referenced: libstdc++ holds only the bare function pointer).
_PREVIOUS_TERMINATE: Any = None
_TERMINATE_GUARD: Any = None


def _on_terminate() -> None:
    """std::terminate in a multi-process job: let the watchdog name a lost peer before anything aborts.

    When a peer is SIGKILLed mid-collective, Gloo's network thread can meet a message it did not expect (this
    process's own devices out of step once one of their collectives failed: "op.preamble.length <= op.nbytes. 768
    vs 4") and throw; the exception escapes the thread, and std::terminate prints it and aborts the process (exit
    134) before the watchdog, which needs heartbeat_timeout_s, can say which peer was lost and exit with
    LOST_PEER_EXIT_CODE. Here that thread waits for the watchdog's verdict instead (the others run on: only the
    collective it served is stuck, and the process is about to leave anyway). No verdict within verdict_wait_s:
    the failure was this process's own, and the C++ runtime reports and aborts as it would have."""
    w = _ACTIVE
    if w is not None:
        from vit_jax.errors import debug_enabled

        if debug_enabled():
            _say(f"a native thread called std::terminate; waiting up to {w.verdict_wait_s:.0f}s to learn whether a "
                 "peer was lost")
        w.await_verdict()  # the watchdog thread exits the process here when a peer was lost
    if _PREVIOUS_TERMINATE is not None:
        _PREVIOUS_TERMINATE()
    os.abort()


def _guard_terminate() -> bool:
    """Installs _on_terminate as the C++ runtime's terminate handler (libstdc++, which jaxlib and its Gloo use);
    False where there is none to hook (another C++ runtime: Gloo's abort then stays as it was)."""
    global _PREVIOUS_TERMINATE, _TERMINATE_GUARD
    import ctypes

    try:
        set_terminate = ctypes.CDLL("libstdc++.so.6")["_ZSt13set_terminatePFvvE"]  # std::set_terminate
    except (OSError, AttributeError):
        return False
    set_terminate.restype, set_terminate.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    handler = ctypes.CFUNCTYPE(None)
    _TERMINATE_GUARD = handler(_on_terminate)
    previous = set_terminate(ctypes.cast(_TERMINATE_GUARD, ctypes.c_void_p).value)
    _PREVIOUS_TERMINATE = handler(previous) if previous else None
    return True


def start(lost_after_s: float) -> PeerWatchdog | None:
    """Starts failure handling for this process of an initialised multi-process job (no-op for one process):
    the watchdog thread, the excepthook that turns an uncaught exception into a fast job-wide stop, the exit
    handler that marks a normal exit, and the terminate handler that keeps Gloo's abort from pre-empting the
    watchdog's verdict on a lost peer."""
    global _ACTIVE
    from jax._src import distributed  # the client JAX created; there is no public accessor

    state = distributed.global_state
    if state.client is None or (state.num_processes or 1) <= 1 or _ACTIVE is not None:
        return _ACTIVE
    _ACTIVE = PeerWatchdog(state.client, state.process_id, state.num_processes, lost_after_s=lost_after_s,
                           coordinator=state.coordinator_address or "").start()
    sys.excepthook = _excepthook
    _guard_terminate()
    # Registered after JAX's own exit handler, so it runs before JAX's shutdown barrier.
    atexit.register(_ACTIVE.mark_done)
    return _ACTIVE
