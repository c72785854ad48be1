"""launch/local.py with tiny stand-in programs (no JAX): flags appended, output prefixed, failures and signals."""

from __future__ import annotations

import signal
import sys

from tests.launch.helpers import LOCAL_LAUNCHER, ROOT, Job

# Prints its arguments and JAX_PLATFORMS; then behaves as $1 says: 'ok', 'fail-if-1' (process 1 exits 3, the
# others hang), or 'wait-term' (waits for SIGTERM, then exits 0).
PROGRAM = r"""
import os, signal, sys, time
args = sys.argv[1:]
pid = int(next(a for a in args if a.startswith("--config.distributed.process_id=")).split("=")[1])
print("args", " ".join(args[1:]), "platform", os.environ.get("JAX_PLATFORMS"), flush=True)
if args[0] == "fail-if-1" and pid == 1:
    sys.exit(3)
if args[0] == "wait-term":
    signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM, saving", flush=True), sys.exit(0)))
    print("ready", flush=True)
if args[0] != "ok":
    time.sleep(600)
"""


def launch(tmp_path, start_job, mode: str, *options: str) -> Job:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    return start_job([sys.executable, str(LOCAL_LAUNCHER), "-n", "2", *options, "--", sys.executable, str(program),
                      mode, "--workdir=relative/run"])


def test_each_process_gets_the_distributed_flags_and_a_prefix(tmp_path, start_job):
    job = launch(tmp_path, start_job, "ok", "--cpu-devices", "3", "--port", "12345")
    assert job.finish(60) == 0, job.tail()
    for i in (0, 1):
        words = next(line for line in job.lines if line.startswith(f"[{i}] args")).split()
        assert f"--workdir={ROOT / 'relative' / 'run'}" in words  # made absolute (the job runs in ROOT)
        assert {"--config.distributed.coordinator=127.0.0.1:12345", "--config.distributed.num_processes=2",
                f"--config.distributed.process_id={i}", "--config.num_cpu_devices=3"} <= set(words)
        assert words[-2:] == ["platform", "cpu"]
    assert "[local] process 0 exited with code 0" in job.lines and "[local] process 1 exited with code 0" in job.lines


def test_a_failure_gives_the_others_a_grace_period_then_kills_them(tmp_path, start_job):
    job = launch(tmp_path, start_job, "fail-if-1", "--grace", "1")
    assert job.finish(60) == 3, job.tail()
    assert "[local] process 1 exited with code 3; waiting up to 1s for the others to stop" in job.lines
    assert "[local] killing the processes still running after 1s" in job.lines
    assert any(line.startswith("[local] process 0 was killed by SIGKILL") for line in job.lines)


def test_sigterm_is_forwarded_once_to_every_process(tmp_path, start_job):
    job = launch(tmp_path, start_job, "wait-term")
    job.wait_for(r"^\[0\] ready")
    job.wait_for(r"^\[1\] ready")
    job.proc.send_signal(signal.SIGTERM)
    assert job.finish(60) == 0, job.tail()
    assert "[0] got SIGTERM, saving" in job.lines and "[1] got SIGTERM, saving" in job.lines


def test_the_root_cause_is_the_first_failure_that_is_not_a_survivors_lost_peer_exit():
    from launch import local

    lost = local.LOST_PEER_EXIT_CODE
    # Two exits noticed in one poll on a loaded machine: the survivor's 75 may be timed first; it is never the cause.
    assert local.root_cause([(10.00, 0, lost), (10.01, 1, 1)]) == (10.01, 1, 1)
    assert local.root_cause([(10.0, 1, -9), (12.0, 0, lost)]) == (10.0, 1, -9)  # a SIGKILLed process
    assert local.root_cause([(9.0, 2, 3), (10.0, 1, 1)]) == (9.0, 2, 3)  # otherwise by time
    assert local.root_cause([(11.0, 1, lost), (10.0, 0, lost)]) == (10.0, 0, lost)  # only survivors: the first
    # Gloo aborts a survivor whose peer vanished mid-collective (seen in CI): the kill is the cause, even timed later.
    assert local.root_cause([(10.0, 0, -6), (10.01, 1, -9)]) == (10.01, 1, -9)
    assert local.root_cause([(10.0, 1, lost), (10.5, 0, -6)]) == (10.5, 0, -6)  # an abort outranks a survivor
