#!/usr/bin/env python3
"""Local multi-process launcher: N JAX processes on this machine, coordinated over localhost (CPU collectives).

    python launch/local.py -n 2 --cpu-devices 2 -- python -m vit_jax.main --config=configs/demo.py --workdir=/tmp/run

Appends `--config.distributed.coordinator=127.0.0.1:PORT --config.distributed.num_processes=N
--config.distributed.process_id=I` (and `--config.num_cpu_devices=K`) to the command, prefixes every output line with
`[I] `, and forwards SIGTERM/SIGINT to all processes (the trainer then saves a checkpoint at the same step everywhere
and exits 0; a second signal kills them). When a process fails, the others stop by themselves within about
`distributed.heartbeat_timeout_s` (see vit_jax/parallel/watchdog.py); any still running after `--grace` seconds are
killed. Exit status: 0 when every process exited 0, otherwise the root cause's (128+N for signal N): the first
failure that is not a survivor's lost-peer exit 75 or SIGABRT.

Standard library only, so it runs under any python3. A relative --workdir is made absolute (Orbax refuses relative
paths in multi-process jobs).
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Sequence


# vit_jax.parallel.watchdog.LOST_PEER_EXIT_CODE (this launcher imports nothing of vit_jax): the exit status of a
# healthy process that stopped because another one failed or was lost.
LOST_PEER_EXIT_CODE = 75


def free_port() -> int:
    """A TCP port nobody listens on right now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def absolute_workdir(command: Sequence[str]) -> list[str]:
    """The command with a local relative `--workdir` made absolute (URLs such as gs:// are left alone)."""
    out = list(command)
    for i, arg in enumerate(out):
        if arg.startswith("--workdir="):
            value = arg.split("=", 1)[1]
            if "://" not in value:
                out[i] = "--workdir=" + os.path.abspath(value)
        elif arg == "--workdir" and i + 1 < len(out) and "://" not in out[i + 1]:
            out[i + 1] = os.path.abspath(out[i + 1])
    return out


def process_command(command: Sequence[str], num_processes: int, process_id: int, port: int,
                    cpu_devices: int = 0) -> list[str]:
    """The command process `process_id` runs: the user's command plus the distributed flags."""
    extra = [f"--config.distributed.coordinator=127.0.0.1:{port}",
             f"--config.distributed.num_processes={num_processes}",
             f"--config.distributed.process_id={process_id}"]
    if cpu_devices:
        extra.append(f"--config.num_cpu_devices={cpu_devices}")
    return absolute_workdir(command) + extra


def exit_description(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class LocalJob:
    """The N processes of one local job; `wait()` supervises them to the end."""

    def __init__(self, command: Sequence[str], num_processes: int, *, cpu_devices: int = 0, port: int = 0,
                 platform: str = "cpu", grace_s: float = 60.0, out: IO[str] | None = None,
                 env: dict[str, str] | None = None):
        if num_processes < 1:
            raise ValueError("the number of processes must be at least 1")
        if not command:
            raise ValueError("no command given; put the training command after --")
        self.num_processes = num_processes
        self.port = port or free_port()
        self.grace_s = grace_s
        self.out = out or sys.stdout
        self._lock = threading.Lock()
        env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        if platform:
            env["JAX_PLATFORMS"] = platform
        self.commands = [process_command(command, num_processes, i, self.port, cpu_devices)
                         for i in range(num_processes)]
        self.procs: list[subprocess.Popen] = []
        self._readers: list[threading.Thread] = []
        self._signals = 0
        for i, cmd in enumerate(self.commands):
            # A session of its own: a terminal's Ctrl-C reaches only this launcher, which forwards it once.
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            self.procs.append(p)
            self.say(f"started process {i} (pid {p.pid})")
            t = threading.Thread(target=self._pump, args=(i, p), daemon=True)
            t.start()
            self._readers.append(t)

    def say(self, msg: str) -> None:
        self._write(f"[local] {msg}\n")

    def _write(self, text: str) -> None:
        with self._lock:
            self.out.write(text)
            self.out.flush()

    def _pump(self, i: int, p: subprocess.Popen) -> None:
        for raw in iter(p.stdout.readline, b""):
            self._write(f"[{i}] {raw.decode(errors='replace').rstrip()}\n")

    def signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def on_signal(self, signum: int, frame=None) -> None:
        """First SIGTERM/SIGINT: forward SIGTERM (preemption: save and stop). Second: kill everything."""
        del frame
        self._signals += 1
        if self._signals == 1:
            self.say(f"received {signal.Signals(signum).name}: asking every process to save and stop (SIGTERM)")
            self.signal_all(signal.SIGTERM)
        else:
            self.say("second signal: killing every process")
            self.signal_all(signal.SIGKILL)

    def _watch(self, i: int, p: subprocess.Popen, exits: "queue.Queue[tuple[float, int, int]]") -> None:
        code = p.wait()
        exits.put((time.monotonic(), i, code))

    def wait(self) -> int:
        """Waits for every process; returns 0 or the root cause's exit status (see `root_cause`)."""
        exits: queue.Queue[tuple[float, int, int]] = queue.Queue()
        for i, p in enumerate(self.procs):  # one waiter each: exits are timed when they happen, not when polled
            threading.Thread(target=self._watch, args=(i, p, exits), daemon=True).start()
        codes: dict[int, int] = {}
        failures: list[tuple[float, int, int]] = []
        deadline = float("inf")
        while len(codes) < len(self.procs):
            try:
                when, i, code = exits.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.say(f"killing the processes still running after {self.grace_s:.0f}s")
                    self.signal_all(signal.SIGKILL)
                    deadline = float("inf")
                continue
            codes[i] = code
            if code == 0:
                self.say(f"process {i} exited with code 0")
            elif not failures:
                self.say(f"process {i} {exit_description(code)}; waiting up to {self.grace_s:.0f}s for the others "
                         "to stop")
                deadline = when + self.grace_s
            else:
                self.say(f"process {i} {exit_description(code)} ({when - failures[0][0]:.1f}s after the first failure)")
            if code:
                failures.append((when, i, code))
        for t in self._readers:
            t.join(timeout=5)
        if not failures:
            return 0
        _, i, code = root_cause(failures)
        if len(failures) > 1:
            self.say(f"root cause: process {i} ({exit_description(code)})")
        return 128 - code if code < 0 else code


def root_cause(failures: list[tuple[float, int, int]]) -> tuple[float, int, int]:
    """The failure that stopped the job, from (time, process, code) of every non-zero exit: the earliest one that
    is not a survivor's LOST_PEER_EXIT_CODE (a process that exits 75 saw another one fail first, whatever the order
    its exit was noticed in on a loaded machine) nor a SIGABRT (how JAX's coordination service and Gloo end a
    survivor whose peer vanished mid-collective); else the earliest abort; the earliest of all if every process
    exited 75."""
    def rank(f: tuple[float, int, int]) -> tuple[int, float]:
        return (f[2] == LOST_PEER_EXIT_CODE) * 2 + (f[2] in (-signal.SIGABRT, 128 + signal.SIGABRT)), f[0]
    return min(failures, key=rank)


def run(command: Sequence[str], num_processes: int, **kw) -> int:
    """Runs the job to the end with signal forwarding; the Python entry point for other tools (e.g. sweeps)."""
    job = LocalJob(command, num_processes, **kw)
    # Signal handlers can only be installed from the main thread; elsewhere the caller forwards signals itself.
    in_main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, job.on_signal) for s in (signal.SIGTERM, signal.SIGINT)} if in_main else {}
    try:
        return job.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit("usage: local.py -n N [options] -- <training command>  (the command goes after --)")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--num-processes", type=int, required=True)
    parser.add_argument("--cpu-devices", type=int, default=0,
                        help="simulated CPU devices per process (appends --config.num_cpu_devices)")
    parser.add_argument("--port", type=int, default=0, help="coordinator port (default: a free one)")
    parser.add_argument("--platform", default="cpu", help="JAX_PLATFORMS for the processes ('' keeps yours)")
    parser.add_argument("--grace", type=float, default=60.0,
                        help="after a failure, seconds the others get to stop by themselves before being killed")
    return parser.parse_args(argv[:split]), argv[split + 1:]


def main(argv: Sequence[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(command, args.num_processes, cpu_devices=args.cpu_devices, port=args.port,
                   platform=args.platform, grace_s=args.grace)
    except (ValueError, OSError) as e:
        print(f"local.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
