"""launch/slurm.py: the sbatch script's resources, environment and srun line, and what the script does after the
training ends (finished / preempted or out of time / lost peer / failed), run with a fake srun and scontrol."""

from __future__ import annotations

import os
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
                   "export XLA_PYTHON_CLIENT_MEM_FRACTION=0.90", "export NCCL_DEBUG=WARN",
                   "export NCCL_SOCKET_IFNAME=ib0"):
        assert export in lines
    assert "JAX_LOCAL_DEVICE_IDS" not in out  # one process per GPU: JAX picks the GPU of SLURM_LOCALID
    assert lines.index("source /shared/venv/bin/activate") < next(i for i, l in enumerate(lines) if "srun" in l)
    assert ("srun --kill-on-bad-exit=1 --label python -m vit_jax.main --workdir=/shared/runs/b16 "
            "--config=configs/demo.py --config.batch_size=4096 &") in lines
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
# Records its arguments; 'finishes' the run (summary.json) if asked; exits with $FAKE_SRUN_RC.
echo "$@" > "$FAKE_LOG/srun.args"
if [ "${FAKE_FINISH:-0}" = 1 ]; then echo '{}' > "$FAKE_WORKDIR/summary.json"; fi
exit "${FAKE_SRUN_RC:-0}"
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$@" >> "$FAKE_LOG/scontrol.calls"
"""


@pytest.fixture
def run_script(tmp_path):
    """Runs the generated script under bash with fake srun/scontrol first on PATH; returns (exit code, calls)."""
    bin_dir, workdir = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    workdir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    job = slurm.SlurmJob(workdir=str(workdir), trainer_args=TRAINER_ARGS, nodes=2, gpus_per_node=8, max_restarts=2,
                         repo=str(tmp_path))
    script = tmp_path / "job.sbatch"
    script.write_text(slurm.render_script(job))

    def run(rc: int = 0, finish: bool = False, restarts: int = 0) -> tuple[int, list[str], str]:
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path),
               "FAKE_WORKDIR": str(workdir), "FAKE_SRUN_RC": str(rc), "FAKE_FINISH": str(int(finish)),
               "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_RESTART_COUNT": str(restarts)}
        r = subprocess.run(["bash", str(script)], env=env, text=True, capture_output=True, timeout=60)
        calls = Path(tmp_path / "scontrol.calls")
        requeues = calls.read_text().splitlines() if calls.exists() else []
        if calls.exists():
            calls.unlink()
        (workdir / "summary.json").unlink(missing_ok=True)
        return r.returncode, requeues, r.stdout

    return run


def test_script_requeues_a_run_stopped_by_the_time_limit_or_preemption(run_script, tmp_path):
    code, requeues, out = run_script(rc=0, finish=False)
    assert (code, requeues) == (0, ["requeue 4242"]) and "requeueing to resume" in out
    srun_args = (tmp_path / "srun.args").read_text().split()
    assert srun_args[:6] == ["--kill-on-bad-exit=1", "--label", "python", "-m", "vit_jax.main",
                             f"--workdir={tmp_path / 'work'}"]


def test_script_ends_a_finished_run(run_script):
    assert run_script(rc=0, finish=True)[:2] == (0, [])


def test_script_requeues_a_lost_peer_a_bounded_number_of_times(run_script):
    assert run_script(rc=75, restarts=0)[:2] == (0, ["requeue 4242"])
    assert run_script(rc=75, restarts=2)[:2] == (75, [])  # --max-restarts=2 used up


def test_script_fails_on_other_errors(run_script):
    code, requeues, out = run_script(rc=1)
    assert (code, requeues) == (1, []) and "training failed with exit code 1" in out
