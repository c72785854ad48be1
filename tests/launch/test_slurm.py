"""launch/slurm.py without a cluster: the sbatch script's resources, environment and srun line (dry runs), and the
script's decisions in what a one-node cluster cannot produce (4 ranks on 2 nodes, a lost node, srun itself failing,
many time-limit requeues), run with a fake srun and scontrol. Everything a one-node cluster can produce runs on a
real one: test_slurm_cluster.py."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys

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
    assert ("srun --kill-on-bad-exit=0 --label bash -c " + shlex.quote(slurm.RECORD_EXIT) + " rank python -m "
            "vit_jax.main --workdir=/shared/runs/b16 --config=configs/demo.py --config.batch_size=4096 &") in lines
    assert 'exit_dir=/shared/runs/b16/.exit/"$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"' in lines
    assert "for rank in $(seq 0 31); do" in lines
    assert "--config.distributed" not in out
    assert lines[-1] == "sbatch /shared/runs/b16/vit_jax.sbatch"


def test_cpu_job_one_process_per_task_on_cpu():
    out = dry_run("--gpus-per-node", "0", "--cpu-tasks-per-node", "2", "--workdir", "/s/r", "--", *TRAINER_ARGS)
    assert "#SBATCH --ntasks-per-node=2" in out and "--gpus-per-node" not in out
    assert "export JAX_PLATFORMS=cpu" in out and "XLA_FLAGS" not in out and "CUDA_DEVICE_MAX_CONNECTIONS" not in out
    assert "1 node(s) x 2 CPU process(es) (2 JAX processes)" in out


def test_one_process_per_node_sees_all_its_gpus():
    out = dry_run("--nodes", "2", "--gpus-per-node", "4", "--per-node", "--no-exclusive", "--workdir", "/s/r", "--",
                  *TRAINER_ARGS)
    assert "#SBATCH --ntasks-per-node=1" in out and "export JAX_LOCAL_DEVICE_IDS=0,1,2,3" in out
    assert "#SBATCH --exclusive" not in out and "(2 JAX processes)" in out


@pytest.mark.parametrize("workdir, args, message", [
    ("runs/b16", [], "--workdir must be an absolute path"),
    ("/s/r", ["--config.distributed.coordinator=h:1"], "no --config.distributed.coordinator/num_processes/"),
    ("/s/r", ["--cpu-tasks-per-node=2"], "--cpu-tasks-per-node is for CPU jobs (--gpus-per-node 0)"),
])
def test_bad_arguments_fail_with_one_line(workdir, args, message):
    launcher_args = [a for a in args if a.startswith("--cpu-")]
    trainer_args = [a for a in args if not a.startswith("--cpu-")]
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "slurm.py"), "--workdir", workdir, *launcher_args,
                        "--dry-run", "--", *trainer_args], text=True, capture_output=True)
    assert r.returncode == 2 and message in r.stderr.strip().splitlines()[-1]


FAKE_SRUN = """#!/bin/bash
# Like srun: runs the command once per rank (SLURM_PROCID set) and exits with the highest exit status, 128+N for a
# rank killed by signal N. FAKE_CODES says what each rank's trainer does: exit with a code, 'kill' (SIGKILLed, as by
# the OOM killer: its task survives to record 137), 'gone' (never reports: its node died, or srun killed the task), or
# 'abort' (SIGABRT, as Gloo or JAX's coordination service end a survivor whose peer vanished),
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
# One rank's trainer: exits as FAKE_WHAT says.
if [ "$FAKE_WHAT" = kill ]; then kill -9 $$; fi
if [ "$FAKE_WHAT" = abort ]; then kill -6 $$; fi
if [ "$FAKE_WHAT" = raise ]; then echo 1 > "$VIT_JAX_EXIT_FILE"; kill -9 $PPID $$; fi
exit "$FAKE_WHAT"
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$@" >> "$FAKE_LOG/scontrol.calls"
if [ "$1" = show ]; then echo "JobId=4242 JobName=vit_jax JobState=RUNNING Reason=None"; fi
"""


@pytest.fixture
def run_script(tmp_path):
    """Runs the generated script (4 ranks: 2 nodes x 2 GPUs) under bash with fake srun/scontrol first on PATH and a
    fake trainer; returns (exit code, requeue calls, the job Comment it set last, output). The workdir persists
    across calls, as over requeues."""
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

    def run(codes: str, restarts: int = 0, srun_fails: bool = False) -> tuple[int, list[str], str, str]:
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path),
               "FAKE_CODES": codes, "FAKE_SRUN_FAILS": "1" if srun_fails else "", "SLURM_JOB_ID": "4242",
               "SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_RESTART_COUNT": str(restarts)}
        r = subprocess.run(["bash", str(script)], env=env, text=True, capture_output=True, timeout=60)
        calls = tmp_path / "scontrol.calls"
        lines = calls.read_text().splitlines() if calls.exists() else []
        calls.unlink(missing_ok=True)
        comments = [line.split("Comment=", 1)[1] for line in lines if line.startswith("update JobId=4242 Comment=")]
        return r.returncode, [line for line in lines if line.startswith("requeue")], comments[-1], r.stdout

    return run


@pytest.mark.parametrize("codes, failed, cause", [
    # rank 1 raised; the watchdog stopped the others with 75, so srun itself exits 75
    ("75 1 75 75", 1, "rank 1 failed with exit code 1"),
    # the same, but srun killed rank 1 while it waited for the others to read its error
    ("75 raise 75 75", 1, "rank 1 failed with exit code 1"),
    # rank 0 raised and srun killed the rest before the watchdog could (srun: 137)
    ("1 gone gone gone", 1, "rank 0 failed with exit code 1"),
    # a config error on the second node
    ("75 75 2 75", 2, "rank 2 failed with exit code 2"),
])
def test_a_rank_that_failed_ends_the_job_whatever_srun_returns(run_script, tmp_path, codes, failed, cause):
    """4 ranks on 2 nodes, in the orders a failure reaches srun: the first rank that failed by itself is the root
    cause, whatever the others' codes and srun's own. (The one-node cluster runs 2 ranks.)"""
    code, requeues, comment, out = run_script(codes)
    assert (code, requeues) == (failed, [])
    assert comment == f"vit_jax: training failed with exit code {failed} (root cause: {cause}): not requeueing"
    assert f"[slurm] training failed with exit code {failed} (root cause: {cause}): not requeueing" in out
    # Every rank's task, on either node, wrote its status into this attempt's folder.
    srun_args = (tmp_path / "srun.args").read_text().splitlines()
    assert srun_args[:5] == ["--kill-on-bad-exit=0", "--label", "bash", "-c", slurm.RECORD_EXIT]
    recorded = {"raise": "1", "gone": "none"}  # what the task wrapper writes for them
    assert "exit status by rank: " + " ".join(f"{r}:{recorded.get(c, c)}" for r, c in enumerate(codes.split())) in out


@pytest.mark.parametrize("codes, cause", [
    ("kill gone gone gone", "rank 0 was killed by SIGKILL (exit 137)"),  # rank 0 killed, srun ended the rest
    ("75 75 gone 75", "rank 2 left no exit status (its node was lost, or srun ended it)"),  # node 2 went down
    # rank 2's node went down; srun ended rank 0's task with SIGTERM before its trainer could handle it
    ("143 75 gone 75", "rank 2 left no exit status (its node was lost, or srun ended it)"),
    # rank 1 killed mid-collective; Gloo aborted rank 0 (seen on the real cluster): the kill is the cause
    ("abort kill 75 75", "rank 1 was killed by SIGKILL (exit 137)"),
    # an XLA check failure aborts rank 0; srun ends the others without a status
    ("abort gone gone gone", "rank 0 was killed by SIGABRT (exit 134)"),
])
def test_a_lost_node_or_killed_rank_among_four_is_requeued(run_script, codes, cause):
    """A node that goes down (no status at all from its ranks) cannot happen on a one-node cluster."""
    code, requeues, comment, out = run_script(codes)
    assert (code, requeues) == (0, ["requeue 4242"])
    assert comment == (f"vit_jax: a process was lost (root cause: {cause}): requeueing to resume from the last "
                       "checkpoint (restart 1/2)")


def test_lost_process_requeues_are_bounded_by_our_own_counter_not_slurms(run_script, tmp_path):
    """Requeues after lost processes are counted apart from SLURM_RESTART_COUNT, which also counts time limits and
    preemptions: here after 7 to 10 requeues, more than a one-node test can afford (the real cluster test checks one
    lost-process requeue, then the failure once the count is used up)."""
    assert run_script("75 kill 75 75", restarts=7)[:2] == (0, ["requeue 4242"])
    assert run_script("0 0 0 0", restarts=8)[:2] == (0, ["requeue 4242"])  # a time limit: not counted
    assert run_script("75 75 gone 75", restarts=9)[:2] == (0, ["requeue 4242"])
    assert (tmp_path / "work" / ".exit" / "lost-restarts.4242").read_text() == "2\n"
    code, requeues, comment, out = run_script("kill 75 75 75", restarts=10)  # --max-restarts=2 used up
    assert (code, requeues) == (137, [])
    assert comment == ("vit_jax: training failed with exit code 137 (root cause: rank 0 was killed by SIGKILL (exit "
                       "137); 2 restart(s) after lost processes used up)")


def test_srun_failing_before_any_rank_ran_is_not_requeued(run_script):
    """srun itself failing (no step created) cannot be provoked on a healthy one-node cluster."""
    code, requeues, comment, out = run_script("0 0 0 0", srun_fails=True)
    assert (code, requeues) == (1, []) and "exit status by rank: 0:none 1:none 2:none 3:none" in out
    assert comment == ("vit_jax: training failed with exit code 1 (root cause: srun failed with exit code 1 before "
                       "any rank ran): not requeueing")


def test_the_local_cluster_says_what_it_needs(monkeypatch):
    """The SLURM cluster tests cannot run without root and the Debian packages: one line says which is missing."""
    from tests.launch import slurm_cluster

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "slurmd must run as root" in slurm_cluster.missing_requirements()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(slurm_cluster.shutil, "which", lambda name: None if name == "slurmd" else f"/usr/bin/{name}")
    assert slurm_cluster.missing_requirements().endswith(
        "slurmd is not installed: run `make test` (it installs the Debian packages) or `apt-get install slurmctld "
        "slurmd slurm-client munge`")
