"""launch/slurm.py: the sbatch script's resources, environment and srun line, and what the script does after the
training ends (finished / preempted or out of time / lost peer / failed), run with a fake srun and scontrol."""

from __future__ import annotations

import os
import shlex
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launch import slurm
from tests.launch.helpers import ROOT

TRAINER_ARGS = ["--config=configs/demo.py", "--config.batch_size=4096"]


def dry_run(*args: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / "launch" / "slurm.py"), "--dry-run", *args], text=True,
                          capture_output=True, check=True).stdout


def test_dry_run_one_process_per_gpu_with_requeue_signal_and_gpu_settings():
    out = dry_run("--nodes", "4", "--gpus-per-node", "8", "--partition", "h200", "--time", "04:00:00",
                  "--workdir", "/shared/runs/b16", "--setup", "source /shared/venv/bin/activate",
                  "--env", "NCCL_SOCKET_IFNAME=ib0", "--", *TRAINER_ARGS)
    lines = out.splitlines()
    assert lines[0] == "# /shared/runs/b16/vit_jax.sbatch" and lines[1] == "#!/bin/bash"
    assert "32 JAX processes" in lines[2]
    for directive in ("--nodes=4", "--ntasks-per-node=8", "--gpus-per-node=8", "--time=04:00:00", "--requeue",
                      "--signal=TERM@120", "--output=/shared/runs/b16/slurm-%j.out", "--open-mode=append",
                      "--partition=h200", "--exclusive"):
        assert f"#SBATCH {directive}" in lines
    for export in ("export VIT_JAX_DISTRIBUTED=auto", "export XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true",
                   "export XLA_PYTHON_CLIENT_MEM_FRACTION=0.90", "export CUDA_DEVICE_MAX_CONNECTIONS=1",
                   "export NCCL_DEBUG=WARN", "export NCCL_SOCKET_IFNAME=ib0"):
        assert export in lines
    assert "JAX_LOCAL_DEVICE_IDS" not in out  # one process per GPU: JAX picks the GPU of SLURM_LOCALID
    assert lines.index("source /shared/venv/bin/activate") < next(i for i, l in enumerate(lines) if "srun" in l)
    # Each task records its trainer's exit status under WORKDIR/.exit/ (read back after srun).
    assert ("srun --kill-on-bad-exit=1 --label bash -c " + shlex.quote(slurm.RECORD_EXIT) + " rank python -m "
            "vit_jax.main --workdir=/shared/runs/b16 --config=configs/demo.py --config.batch_size=4096 &") in lines
    assert 'exit_dir=/shared/runs/b16/.exit/"$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"' in lines
    assert "for rank in $(seq 0 31); do" in lines
    assert "--config.distributed" not in out
    assert lines[-1] == "sbatch /shared/runs/b16/vit_jax.sbatch"


def test_one_process_per_node_sees_all_its_gpus():
    out = dry_run("--nodes", "2", "--gpus-per-node", "4", "--per-node", "--no-exclusive", "--workdir", "/s/r", "--",
                  *TRAINER_ARGS)
    assert "#SBATCH --ntasks-per-node=1" in out and "export JAX_LOCAL_DEVICE_IDS=0,1,2,3" in out
    assert "#SBATCH --exclusive" not in out and "(2 JAX processes)" in out


@pytest.mark.parametrize("workdir, args, message", [
    ("runs/b16", [], "--workdir must be an absolute path"),
    ("/s/r", ["--config.distributed.coordinator=h:1"], "no --config.distributed.* flags"),
])
def test_bad_arguments_fail_with_one_line(workdir, args, message):
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "slurm.py"), "--workdir", workdir, "--dry-run", "--",
                        *args], text=True, capture_output=True)
    assert r.returncode == 2 and message in r.stderr.strip().splitlines()[-1]


FAKE_SRUN = """#!/bin/bash
# Like srun: runs the command once per rank (SLURM_PROCID set) and exits with the highest exit status, 128+N for a
# rank killed by signal N. FAKE_CODES says what each rank's trainer does: exit with a code, 'kill' (SIGKILLed, as by
# the OOM killer: its task survives to record 137), 'gone' (never reports: its node died, or srun killed the task), or
# 'raise' (its watchdog records 1, then srun kills the task while the peers read the error: the real order).
printf '%s\\n' "$@" > "$FAKE_LOG/srun.args"
if [ -n "${FAKE_SRUN_FAILS:-}" ]; then echo "srun: error: Unable to create step" >&2; exit 1; fi
while [[ "$1" == --* ]]; do shift; done
rank=0; rc=0
for what in $FAKE_CODES; do
  if [ "$what" = gone ]; then code=137; else FAKE_WHAT=$what SLURM_PROCID=$rank "$@"; code=$?; fi
  if [ "$code" -gt "$rc" ]; then rc=$code; fi
  rank=$((rank + 1))
done
exit "$rc"
"""
FAKE_TRAINER = """#!/bin/bash
# One rank's trainer: rank 0 'finishes' the run (summary.json) if asked; then exits as FAKE_WHAT says.
if [ "${FAKE_FINISH:-0}" = 1 ] && [ "$SLURM_PROCID" = 0 ]; then echo '{}' > "$FAKE_WORKDIR/summary.json"; fi
if [ "$FAKE_WHAT" = kill ]; then kill -9 $$; fi
if [ "$FAKE_WHAT" = raise ]; then echo 1 > "$VIT_JAX_EXIT_FILE"; kill -9 $PPID $$; fi
exit "$FAKE_WHAT"
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$@" >> "$FAKE_LOG/scontrol.calls"
"""


@pytest.fixture
def run_script(tmp_path):
    """Runs the generated script (4 ranks: 2 nodes x 2 GPUs) under bash with fake srun/scontrol first on PATH and a
    fake trainer; returns (exit code, scontrol calls, output). The workdir persists across calls, as over requeues."""
    bin_dir, workdir = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    workdir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("trainer", FAKE_TRAINER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    job = slurm.SlurmJob(workdir=str(workdir), trainer_args=TRAINER_ARGS, nodes=2, gpus_per_node=2, max_restarts=2,
                         python=str(bin_dir / "trainer"), repo=str(tmp_path))
    script = tmp_path / "job.sbatch"
    script.write_text(slurm.render_script(job))

    def run(codes: str, finish: bool = False, restarts: int = 0,
            srun_fails: bool = False) -> tuple[int, list[str], str]:
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path),
               "FAKE_WORKDIR": str(workdir), "FAKE_CODES": codes, "FAKE_FINISH": str(int(finish)),
               "FAKE_SRUN_FAILS": "1" if srun_fails else "", "SLURM_JOB_ID": "4242",
               "SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_RESTART_COUNT": str(restarts)}
        r = subprocess.run(["bash", str(script)], env=env, text=True, capture_output=True, timeout=60)
        calls = Path(tmp_path / "scontrol.calls")
        requeues = calls.read_text().splitlines() if calls.exists() else []
        if calls.exists():
            calls.unlink()
        (workdir / "summary.json").unlink(missing_ok=True)
        return r.returncode, requeues, r.stdout

    return run


def test_script_requeues_a_run_stopped_by_the_time_limit_or_preemption(run_script, tmp_path):
    code, requeues, out = run_script("0 0 0 0")
    assert (code, requeues) == (0, ["requeue 4242"]) and "requeueing to resume" in out
    srun_args = (tmp_path / "srun.args").read_text().splitlines()
    assert srun_args[:5] == ["--kill-on-bad-exit=1", "--label", "bash", "-c", slurm.RECORD_EXIT]
    assert srun_args[5:10] == ["rank", str(tmp_path / "bin" / "trainer"), "-m", "vit_jax.main",
                               f"--workdir={tmp_path / 'work'}"]
    # Every rank's task wrote its exit status into this attempt's folder.
    attempt = tmp_path / "work" / ".exit" / "4242.0"
    assert [(attempt / str(rank)).read_text() for rank in range(4)] == ["0\n"] * 4
    assert "exit status by rank: 0:0 1:0 2:0 3:0" in out


def test_script_ends_a_finished_run(run_script):
    assert run_script("0 0 0 0", finish=True)[:2] == (0, [])


@pytest.mark.parametrize("codes, failed", [
    ("75 1 75 75", 1),  # rank 1 raised; the watchdog stopped the others with 75, so srun itself exits 75
    ("75 raise 75 75", 1),  # the same, but srun killed rank 1 while it waited for the others to read its error
    ("1 gone gone gone", 1),  # rank 0 raised and srun killed the rest before the watchdog could (srun: 137)
    ("75 75 2 75", 2),  # a config error
])
def test_a_rank_that_failed_ends_the_job_whatever_srun_returns(run_script, codes, failed):
    code, requeues, out = run_script(codes)
    assert (code, requeues) == (failed, []) and f"failed with exit code {failed}: not requeueing" in out


@pytest.mark.parametrize("codes", [
    "75 kill 75 75",  # rank 1 was OOM-killed (137); the watchdog stopped the others
    "kill gone gone gone",  # rank 0 killed, srun killed the rest
    "75 75 gone 75",  # rank 2's node went down
])
def test_a_killed_or_lost_rank_is_requeued(run_script, codes):
    code, requeues, out = run_script(codes)
    assert (code, requeues) == (0, ["requeue 4242"]) and "a process was lost" in out and "(restart 1/2)" in out


def test_lost_process_requeues_are_bounded_by_our_own_counter(run_script, tmp_path):
    # SLURM_RESTART_COUNT counts every requeue (time limits, preemptions): after 7 of them, still requeued.
    assert run_script("75 kill 75 75", restarts=7)[:2] == (0, ["requeue 4242"])
    assert run_script("0 0 0 0", restarts=8)[:2] == (0, ["requeue 4242"])  # a time limit: not counted
    assert run_script("75 75 gone 75", restarts=9)[:2] == (0, ["requeue 4242"])
    assert (tmp_path / "work" / ".exit" / "lost-restarts.4242").read_text() == "2\n"
    code, requeues, out = run_script("kill 75 75 75", restarts=10)  # --max-restarts=2 used up
    assert (code, requeues) == (137, []) and "training failed with exit code 137" in out


def test_srun_failing_before_any_rank_ran_is_not_requeued(run_script):
    code, requeues, out = run_script("0 0 0 0", srun_fails=True)
    assert (code, requeues) == (1, []) and "exit status by rank: 0:none 1:none 2:none 3:none" in out


def test_the_task_wrapper_outlives_sigterm_and_records_the_trainers_exit(tmp_path):
    """SLURM signals every process of the step: the wrapper must wait for the trainer's save, not die first."""
    trainer = ("import signal, time\n"
               "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the wrapper's trap is not inherited\n"
               "stop = []\n"
               "signal.signal(signal.SIGTERM, lambda *a: stop.append(1))\n"
               "print('ready', flush=True)\n"
               "while not stop: time.sleep(0.05)\n"
               "time.sleep(0.5)  # saving a checkpoint\n")
    env = {**os.environ, "VIT_JAX_EXIT_DIR": str(tmp_path), "SLURM_PROCID": "3"}
    proc = subprocess.Popen(["bash", "-c", slurm.RECORD_EXIT, "rank", sys.executable, "-c", trainer], env=env,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.killpg(proc.pid, signal.SIGTERM)  # to the wrapper and the trainer alike
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert (tmp_path / "3").read_text() == "0\n"


def test_the_task_wrapper_keeps_the_code_the_watchdog_recorded(tmp_path):
    # The trainer's watchdog wrote 1 (a Python error), then the process was killed before it could exit 1 itself.
    env = {**os.environ, "VIT_JAX_EXIT_DIR": str(tmp_path), "SLURM_PROCID": "0"}
    trainer = 'echo 1 > "$VIT_JAX_EXIT_FILE"; kill -9 $$'
    assert subprocess.run(["bash", "-c", slurm.RECORD_EXIT, "rank", "bash", "-c", trainer], env=env).returncode == 137
    assert (tmp_path / "0").read_text() == "1\n"
