#!/usr/bin/env python3
"""SLURM GPU clusters: writes an sbatch script for a multi-node training run and submits it.

    python launch/slurm.py --nodes 4 --gpus-per-node 8 --partition h200 --time 24:00:00 \\
        --workdir /shared/runs/vit_b16 -- --config=configs/demo.py --config.batch_size=4096

`srun` starts one trainer process per GPU (or per node with --per-node); `jax.distributed.initialize()` reads the
SLURM_* variables (coordinator on the first node). Preemption and the time limit end in a checkpoint, not lost
work: SIGTERM reaches the trainer `--signal-lead` seconds before the limit (and on preemption), the trainer saves at
the same step on every process and exits 0, and the script requeues the job, which resumes from WORKDIR. Each
process's exit status is recorded under WORKDIR/.exit/ (srun's own exit code merges them): a lost process (killed,
or stopped by the watchdog's exit 75 because a peer was lost) is requeued up to --max-restarts times; a process that
failed (a Python error, a config error) ends the job. Each attempt's outcome, with the rank at its root, is printed
and set as the job's Comment (squeue, scontrol show job). `--gpus-per-node 0` makes a CPU job
(`--cpu-tasks-per-node` processes per node): how the tests run it on a one-node cluster (docs/launching.md).

`--dry-run` prints the script and the sbatch command without writing or submitting anything. Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
LOST_PEER_EXIT_CODE = 75  # vit_jax.parallel.watchdog.LOST_PEER_EXIT_CODE
# What jax.distributed reads from SLURM's environment; the other distributed.* keys (timeouts) stay the user's.
SLURM_SETS = tuple(f"--config.distributed.{k}" for k in ("coordinator", "num_processes", "process_id"))
# What each srun task runs around the trainer: it records the trainer's exit status (128+N when signal N killed it,
# e.g. 137 from the OOM killer) in $VIT_JAX_EXIT_DIR/<rank>, unless the trainer's watchdog already wrote there the
# code it stops the job with (vit_jax.parallel.watchdog.record_exit: srun may kill it while its peers read its error).
# SIGTERM reaches every process of the step; the trap makes this shell wait for the trainer (which saves and exits)
# instead of dying first, and is not inherited by it.
RECORD_EXIT = ('trap : TERM; export VIT_JAX_EXIT_FILE="$VIT_JAX_EXIT_DIR/$SLURM_PROCID"; "$@"; rc=$?; '
               '[ -s "$VIT_JAX_EXIT_FILE" ] || echo "$rc" > "$VIT_JAX_EXIT_FILE"; exit "$rc"')

# Why each setting is there: docs/launching.md ("GPU settings").
GPU_ENV = {
    # Overlap the gradient all-reduce (and FSDP all-gathers) with compute.
    "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true",
    # Leave ~10% of each GPU to NCCL buffers, cuDNN/cuBLAS workspaces and the CUDA context.
    "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.90",
    # Hopper (H100/H200): one work queue keeps the collectives in XLA's scheduled order, so they overlap compute.
    # Slower on Blackwell: pass --env CUDA_DEVICE_MAX_CONNECTIONS=8 (CUDA's default) there.
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    # NCCL errors (e.g. a failed InfiniBand link) in the job log instead of a bare 'unhandled system error'.
    "NCCL_DEBUG": "WARN",
    "TF_CPP_MIN_LOG_LEVEL": "3",
}
# CPU jobs (--gpus-per-node 0): CPU collectives (gloo) between the processes, even where a GPU is visible.
CPU_ENV = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}


@dataclasses.dataclass
class SlurmJob:
    """Everything the sbatch script depends on."""

    workdir: str
    trainer_args: list[str]
    nodes: int = 1
    gpus_per_node: int = 8
    per_node: bool = False  # one process per node (all its GPUs) instead of one per GPU
    cpu_tasks_per_node: int = 1  # CPU jobs (gpus_per_node=0): JAX processes per node
    job_name: str = "vit_jax"
    partition: str = ""
    account: str = ""
    qos: str = ""
    time: str = "24:00:00"
    cpus_per_task: int = 0
    exclusive: bool = True
    signal_lead_s: int = 120
    max_restarts: int = 3
    python: str = "python"
    repo: str = str(REPO)
    setup: list[str] = dataclasses.field(default_factory=list)  # shell lines run before srun (modules, venv)
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # added to / overriding GPU_ENV

    @property
    def tasks_per_node(self) -> int:
        if not self.gpus_per_node:
            return self.cpu_tasks_per_node
        return 1 if self.per_node else self.gpus_per_node

    @property
    def num_processes(self) -> int:
        return self.nodes * self.tasks_per_node

    def validate(self) -> None:
        if not os.path.isabs(self.workdir) or any(c.isspace() for c in self.workdir):
            raise ValueError(f"--workdir must be an absolute path without spaces on the cluster's shared "
                             f"filesystem (the log and the requeue check live there), got {self.workdir!r}")
        if self.nodes < 1 or self.gpus_per_node < 0 or self.cpu_tasks_per_node < 1:
            raise ValueError("--nodes and --cpu-tasks-per-node must be at least 1, --gpus-per-node at least 0")
        if self.gpus_per_node and self.cpu_tasks_per_node != 1:
            raise ValueError("--cpu-tasks-per-node is for CPU jobs (--gpus-per-node 0); with GPUs there is one "
                             "process per GPU, or one per node with --per-node")
        if any(a.startswith(("--workdir", *SLURM_SETS)) for a in self.trainer_args):
            raise ValueError("pass --workdir to slurm.py, and no --config.distributed.coordinator/num_processes/"
                             "process_id flags: SLURM sets them")


def sbatch_lines(job: SlurmJob) -> list[str]:
    lines = [f"--job-name={job.job_name}", f"--nodes={job.nodes}", f"--ntasks-per-node={job.tasks_per_node}",
             *([f"--gpus-per-node={job.gpus_per_node}"] if job.gpus_per_node else []), f"--time={job.time}",
             # Preempted or out of time: back to the queue (the trainer resumes from the workdir).
             "--requeue",
             # SIGTERM to every task before the time limit: the trainer saves and exits 0.
             f"--signal=TERM@{job.signal_lead_s}",
             # A requeued job keeps its id: one log, appended to.
             f"--output={job.workdir}/slurm-%j.out", "--open-mode=append"]
    lines += [f"--{k}={v}" for k, v in (("partition", job.partition), ("account", job.account),
                                        ("qos", job.qos), ("cpus-per-task", job.cpus_per_task)) if v]
    if job.exclusive:
        lines.append("--exclusive")
    return [f"#SBATCH {line}" for line in lines]


def render_script(job: SlurmJob) -> str:
    """The sbatch script (bash)."""
    job.validate()
    # A CPU job (a CPU partition, or the local test cluster of docs/launching.md) computes on CPU whatever JAX finds.
    env = {**(GPU_ENV if job.gpus_per_node else CPU_ENV), **job.env, "VIT_JAX_DISTRIBUTED": "auto"}
    if job.per_node:
        # Under SLURM JAX gives each process only the GPU of its SLURM_LOCALID; one process per node needs all.
        env["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(i) for i in range(job.gpus_per_node))
    exports = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    train = shlex.join(["bash", "-c", RECORD_EXIT, "rank", job.python, "-m", "vit_jax.main",
                        f"--workdir={job.workdir}", *job.trainer_args])
    workdir = shlex.quote(job.workdir)
    exits = shlex.quote(f"{job.workdir}/.exit")
    if job.gpus_per_node:
        mode = "one process per node" if job.per_node else "one process per GPU"
        shape = f"{job.nodes} node(s) x {job.gpus_per_node} GPU(s), {mode}"
    else:
        shape = f"{job.nodes} node(s) x {job.tasks_per_node} CPU process(es)"
    return "\n".join([
        "#!/bin/bash",
        f"# vit_jax training: {shape} ({job.num_processes} JAX processes). Generated by launch/slurm.py; "
        "see docs/launching.md.",
        *sbatch_lines(job),
        "",
        "set -uo pipefail",
        *exports,
        f"cd {shlex.quote(job.repo)}",
        *job.setup,
        f'echo "[slurm] job $SLURM_JOB_ID, restart ${{SLURM_RESTART_COUNT:-0}}, nodes $SLURM_JOB_NODELIST"',
        "",
        "# Every rank's exit status lands here: srun's own code is only the highest of them, so a crash (1) hides",
        "# behind the survivors' 75, and a rank killed by a signal makes it 128+N, never 75. A new folder per attempt:",
        "# a requeued job keeps its id, and a name never looked up before cannot be stale in an NFS client's cache.",
        f'exit_dir={exits}/"$SLURM_JOB_ID.${{SLURM_RESTART_COUNT:-0}}"',
        'mkdir -p "$exit_dir"; export VIT_JAX_EXIT_DIR="$exit_dir"',
        "# The batch shell gets SIGTERM too on preemption; it must outlive srun to requeue the job.",
        "trap 'echo \"[slurm] SIGTERM: the trainer saves a checkpoint and stops\"' TERM",
        "# No --kill-on-bad-exit: srun would kill the other ranks the moment one dies, before their watchdog names",
        "# it and exits 75 (within distributed.heartbeat_timeout_s), leaving no status. A rank that never reaches",
        "# the watchdog (stuck in jax.distributed's start-up) ends after distributed.initialization_timeout_s.",
        f"srun --kill-on-bad-exit=0 --label {train} &",
        "srun_pid=$!",
        "while :; do",
        '  wait "$srun_pid"; rc=$?',
        '  kill -0 "$srun_pid" 2>/dev/null || break  # wait returns early when a trapped signal arrives',
        "done",
        "",
        "# The record of what happened, for people: the log, and the job's Comment (squeue -o %k, scontrol show job).",
        'note() { echo "[slurm] $1"; scontrol update JobId="$SLURM_JOB_ID" Comment="vit_jax: $1" 2>/dev/null || :; }',
        "# A requeued job keeps its id, log and workdir; SLURM ends this script and starts it again (restart count + 1).",
        'requeue() { scontrol requeue "$SLURM_JOB_ID" && exit 0',
        '  note "scontrol requeue failed: sbatch this script again to resume from the workdir"; exit 1; }',
        'error=""; lost=""; recorded=""; codes=""; failed=""; killed=""; aborted=""; gone=""; termed=""; peer=""',
        f"for rank in $(seq 0 {job.num_processes - 1}); do",
        '  code=$(cat "$exit_dir/$rank" 2>/dev/null); [ -n "$code" ] || code=none',
        '  codes="$codes $rank:$code"',
        '  case "$code" in',
        "    0) recorded=1 ;;",
        "    # none: killed with its node (or by srun when the step was cancelled); 75: its watchdog saw a peer lost",
        '    none) lost=1; gone=${gone:-"rank $rank left no exit status (its node was lost, or srun ended it)"} ;;',
        f'    {LOST_PEER_EXIT_CODE}) lost=1; recorded=1; peer=${{peer:-"rank $rank stopped: a peer was lost"}} ;;',
        "    # 128+N: killed by signal N (137: SIGKILL, the OOM killer); below 128: the trainer itself failed",
        '    *) recorded=1',
        '       if [ "$code" -ge 128 ] 2>/dev/null; then',
        '         lost=1; sig=$(kill -l $((code - 128)) 2>/dev/null) && sig=SIG$sig || sig="signal $((code - 128))"',
        "         # SIGTERM is how SLURM ends a step's other tasks, SIGABRT how JAX's coordination service and Gloo",
        "         # end a survivor whose peer vanished mid-collective: consequences more often than causes",
        '         if [ "$code" -eq 143 ]; then termed=${termed:-"rank $rank was killed by SIGTERM (exit 143)"}',
        '         elif [ "$code" -eq 134 ]; then aborted=${aborted:-"rank $rank was killed by SIGABRT (exit 134)"}',
        '         else killed=${killed:-"rank $rank was killed by $sig (exit $code)"}; fi',
        '       else error=${error:-$code}; failed=${failed:-"rank $rank failed with exit code $code"}; fi ;;',
        "  esac",
        "done",
        'echo "[slurm] srun exited with $rc; exit status by rank:$codes"',
        "# The first rank that failed by itself, else the first killed, else the first that aborted, else the first",
        "# that vanished: the others were stopped because of it (by the watchdog, 75, by JAX's coordination service",
        "# when rank 0 died, 134, or by SLURM: no status or SIGTERM). An abort outranks a vanished rank because an",
        "# XLA check failure aborts too, and a lost node leaves its peers' statuses but not its own.",
        'cause=${failed:-${killed:-${aborted:-${gone:-${termed:-$peer}}}}}',
        'if [ -z "$recorded" ] && [ "$rc" -ne 0 ]; then  # no rank ran at all: srun itself failed',
        '  error=$rc; cause="srun failed with exit code $rc before any rank ran"',
        "fi",
        "",
        f"if [ -f {workdir}/summary.json ]; then",
        '  note "training finished"; exit 0',
        "fi",
        'if [ -n "$error" ]; then',
        '  note "training failed with exit code $error (root cause: $cause): not requeueing"; exit "$error"',
        "fi",
        "# SIGTERM from the time-limit warning, `scancel --signal=TERM` or a preemption's grace period leaves the job",
        "# RUNNING; `scancel` (stop for good) and the time limit itself end it (COMPLETING): no requeue then.",
        'state=$(scontrol show job --oneliner "$SLURM_JOB_ID" 2>/dev/null | grep -o "JobState=[A-Z_]*")',
        'if [ -n "$state" ] && [ "$state" != JobState=RUNNING ]; then',
        '  note "stopped while SLURM ends the job (${state#JobState=}: scancel or the time limit): not requeueing; '
        'sbatch this script again to resume"',
        '  exit "$rc"',
        "fi",
        'if [ "$rc" -eq 0 ]; then',
        '  note "stopped before the end (time limit or preemption): requeueing to resume"',
        '  requeue',
        "fi",
        "# Our own count: SLURM_RESTART_COUNT also counts the requeues after time limits and preemptions.",
        f'counter={exits}/"lost-restarts.$SLURM_JOB_ID"',
        'restarts=$(cat "$counter" 2>/dev/null || echo 0)',
        f'if [ -n "$lost" ] && [ "$restarts" -lt {job.max_restarts} ]; then',
        '  echo "$((restarts + 1))" > "$counter"',
        f'  note "a process was lost (root cause: $cause): requeueing to resume from the last checkpoint '
        f'(restart $((restarts + 1))/{job.max_restarts})"',
        '  requeue',
        "fi",
        f'note "training failed with exit code $rc (root cause: $cause; {job.max_restarts} restart(s) after lost '
        'processes used up)"',
        'exit "$rc"',
        "",
    ])


def default_script_path(job: SlurmJob) -> Path:
    return Path(job.workdir) / f"{job.job_name}.sbatch"


def submit(job: SlurmJob, script_path: Path | None = None, dry_run: bool = False) -> int:
    """Writes the script and runs sbatch (dry run: prints both, touches nothing)."""
    script = render_script(job)
    path = script_path or default_script_path(job)
    command = ["sbatch", str(path)]
    if dry_run:
        print(f"# {path}\n{script}\n# submit with:\n{shlex.join(command)}")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    Path(job.workdir).mkdir(parents=True, exist_ok=True)  # sbatch --output needs the folder to exist
    path.write_text(script)
    print(f"wrote {path}\n{shlex.join(command)}", flush=True)
    return subprocess.run(command).returncode


def parse_args(argv: Sequence[str]) -> tuple[SlurmJob, argparse.Namespace]:
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="absolute path on the shared filesystem")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=8, help="0: a CPU job")
    p.add_argument("--per-node", action="store_true", help="one process per node instead of one per GPU")
    p.add_argument("--cpu-tasks-per-node", type=int, default=1,
                   help="with --gpus-per-node 0 (a CPU job): JAX processes per node")
    p.add_argument("--job-name", default="vit_jax")
    p.add_argument("--partition", default="")
    p.add_argument("--account", default="")
    p.add_argument("--qos", default="")
    p.add_argument("--time", default="24:00:00", help="time limit per allocation (the job requeues itself)")
    p.add_argument("--cpus-per-task", type=int, default=0, help="0: the cluster's default")
    p.add_argument("--exclusive", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--signal-lead", type=int, default=120, help="seconds before the time limit to send SIGTERM")
    p.add_argument("--max-restarts", type=int, default=3, help="requeues after a lost process (killed, or exit 75)")
    p.add_argument("--python", default="python", help="the Python of the environment with vit_jax installed")
    p.add_argument("--repo", default=str(REPO), help="checkout the job runs in")
    p.add_argument("--setup", action="append", default=[], help="shell line before srun (repeatable)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment (repeatable)")
    p.add_argument("--script", type=Path, default=None, help="where to write the script (default: WORKDIR)")
    p.add_argument("--dry-run", action="store_true", help="print the script and the sbatch command only")
    args = p.parse_args(argv[:split])
    bad = [e for e in args.env if "=" not in e]
    if bad:
        p.error(f"--env needs KEY=VALUE, got {bad[0]!r}")
    job = SlurmJob(workdir=args.workdir, trainer_args=argv[split + 1:], nodes=args.nodes,
                   gpus_per_node=args.gpus_per_node, per_node=args.per_node,
                   cpu_tasks_per_node=args.cpu_tasks_per_node, job_name=args.job_name,
                   partition=args.partition, account=args.account, qos=args.qos, time=args.time,
                   cpus_per_task=args.cpus_per_task, exclusive=args.exclusive, signal_lead_s=args.signal_lead,
                   max_restarts=args.max_restarts, python=args.python, repo=args.repo, setup=args.setup,
                   env=dict(e.split("=", 1) for e in args.env))
    return job, args


def main(argv: Sequence[str] | None = None) -> int:
    job, args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return submit(job, args.script, dry_run=args.dry_run)
    except ValueError as e:
        print(f"slurm.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
