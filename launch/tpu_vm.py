#!/usr/bin/env python3
"""Cloud TPU VM pods (gcloud): create or reuse a TPU VM or queued resource, install vit_jax on every worker, run the
same training command on all workers, stream its output, relaunch after preemption, delete.

    python launch/tpu_vm.py launch --name vit-pod --zone us-central2-b --accelerator-type v4-32 --spot \\
        --relaunch --workdir gs://my-bucket/runs/vit_b16 -- --config=configs/demo.py --config.batch_size=4096

Subcommands: create | setup | run | launch (= create + setup + run, with --relaunch: loop until finished) | logs |
stop | status | delete. `--dry-run` prints every command instead of running it. `--preflight` (create, launch)
first compiles the trainer's train and eval steps for the pod's topology on this machine with the TPU compiler
(`vit-jax plan --topology ACCELERATOR_TYPE --config ...`: needs vit_jax with libtpu here, no TPU) and refuses to
create or start anything when they do not fit, printing the memory report. Every worker runs
`python -m vit_jax.main --workdir=WORKDIR <trainer args>` with VIT_JAX_DISTRIBUTED=auto, so jax.distributed joins the
pod from the TPU metadata; the trainer resumes from the workdir's latest checkpoint, which is why a relaunch after
preemption is the same command (and why the workdir must be a gs:// bucket: a preempted VM's disk is gone).
Standard library only; needs the gcloud CLI (and `git` for setup from this checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
REMOTE_REPO, REMOTE_VENV, REMOTE_LOGS = "~/vit_jax", "~/vit_jax_venv", "~/vit_jax_logs"
# Left on every worker by `stop` (and removed when a run starts): `launch --relaunch` must not undo a deliberate stop.
STOP_MARKER = f"{REMOTE_LOGS}/stop_requested"
READY = {"vm": "READY", "queued": "ACTIVE"}
# vit_jax.parallel.watchdog.LOST_PEER_EXIT_CODE (this launcher imports nothing of vit_jax): a worker whose peer was
# lost (killed, out of memory, its host down) names it in its log and exits with this; `set -o pipefail` in the
# train command makes it ssh's exit status.
LOST_PEER_EXIT_CODE = 75
# States from which the TPU never comes back by itself: delete and recreate. (Others, such as CREATING,
# WAITING_FOR_RESOURCES, PROVISIONING, SUSPENDING or DELETING, are waited out.)
GONE = {"PREEMPTED", "TERMINATED", "STOPPED", "SUSPENDED", "FAILED"}
# Chips or cores per host, and the default runtime, by TPU generation (accelerator type 'vX-N').
GENERATIONS = {
    "v2": (8, "tpu-ubuntu2204-base"), "v3": (8, "tpu-ubuntu2204-base"),  # N counts TensorCores, 8 per host
    "v4": (8, "tpu-ubuntu2204-base"), "v5p": (8, "v2-alpha-tpuv5"),  # N counts TensorCores: 4 chips x 2 per host
    "v5litepod": (4, "v2-alpha-tpuv5-lite"), "v5e": (4, "v2-alpha-tpuv5-lite"),  # N counts chips, 4 per host
    "v6e": (4, "v2-alpha-tpuv6e"),
}


def exit_reason(rc: int) -> str:
    """How a run's exit status reads in the launcher's messages."""
    if rc == LOST_PEER_EXIT_CODE:
        return f"exit {rc}: a worker lost a peer; the line 'vit_jax watchdog: lost peer ...' above names it"
    return f"exit {rc}"


def parse_accelerator(accelerator_type: str) -> tuple[str, int]:
    m = re.fullmatch(r"(v\d+[a-z]*|v5litepod)-(\d+)", accelerator_type)
    if not m or m.group(1) not in GENERATIONS:
        raise ValueError(f"unknown accelerator type {accelerator_type!r}; expected e.g. v4-32, v5p-128, v5litepod-16, "
                         "v6e-64")
    return m.group(1), int(m.group(2))


def num_workers(accelerator_type: str) -> int:
    """TPU VM hosts (JAX processes) of a slice: v4-32 -> 4, v5p-128 -> 16, v5litepod-16 -> 4, v6e-8 -> 1."""
    generation, n = parse_accelerator(accelerator_type)
    per_host = GENERATIONS[generation][0]
    if per_host == 4 and n <= 8:  # v5e / v6e slices up to 8 chips are a single host
        return 1
    return max(1, n // per_host)


def default_runtime(accelerator_type: str) -> str:
    return GENERATIONS[parse_accelerator(accelerator_type)[0]][1]


class Runner:
    """Runs commands (or, in a dry run, prints them and pretends they succeeded with empty output)."""

    def __init__(self, dry_run: bool = False, say: Callable[[str], None] | None = None):
        self.dry_run = dry_run
        self.say = say or (lambda msg: print(msg, flush=True))

    def __call__(self, cmd: list[str], capture: bool = False) -> subprocess.CompletedProcess:
        self.say(("" if self.dry_run else "+ ") + shlex.join(cmd))
        if self.dry_run:
            return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")
        return subprocess.run(cmd, text=True, capture_output=capture)


def planner_command(accelerator_type: str, trainer_args: Sequence[str], json_path: str,
                    python: str = sys.executable) -> list[str]:
    """`vit-jax plan` for the trainer's config (--config and its --config.* overrides) on the pod's topology."""
    config = [a for a in trainer_args if a.startswith("--config=") or a.startswith("--config.")]
    if not any(a.startswith("--config=") for a in config):
        raise RuntimeError("--preflight needs the trainer's --config=FILE among the arguments after --")
    path = next(a for a in config if a.startswith("--config="))[len("--config="):]
    return [python, "-m", "vit_jax.bench.plan", "--topology", accelerator_type, "--compiler", "tpu", "--config",
            path, *[a for a in config if a.startswith("--config.")], "--output", json_path]


def preflight(args: argparse.Namespace, say: Callable[[str], None]) -> bool:
    """Compiles the run for the pod's topology here; True when it fits (the planner's report is printed)."""
    with tempfile.TemporaryDirectory(prefix="vit_jax_preflight_") as tmp:
        out = os.path.join(tmp, "plan.json")
        cmd = planner_command(args.accelerator_type, args.trainer_args, out)
        say(f"[tpu_vm] preflight: compiling the train and eval steps for {args.accelerator_type} here: "
            f"{shlex.join(cmd)}")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        r = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True)
        if r.returncode != 0 or not os.path.exists(out):
            tail = "\n".join((r.stderr or r.stdout or "").strip().splitlines()[-5:])
            raise RuntimeError(f"preflight could not compile the run (exit {r.returncode}):\n{tail}")
        report = json.load(open(out))
    say(f"[tpu_vm] preflight: {r.stdout.strip()}")
    if report.get("fits"):
        return True
    mib = 1024**2
    eval_oom = (report.get("eval") or {}).get("out_of_memory")
    oom = report.get("out_of_memory") or eval_oom
    say(f"[tpu_vm] preflight: the run does NOT fit {args.accelerator_type} ({report['device_kind']}, "
        f"{report['hbm_per_device_bytes'] / mib:.0f} MiB per device): "
        + (f"{'eval' if eval_oom and not report.get('out_of_memory') else 'train'} step: {oom['message']}" if oom
           else f"peak {report['peak_bytes'] / mib:.0f} MiB per device")
        + f"; parameters {report['params_bytes_per_device'] / mib:.0f} MiB, optimizer state "
        f"{report['opt_state_bytes_per_device'] / mib:.0f} MiB per device. Not creating or starting anything; try "
        f"`vit-jax plan --topology {args.accelerator_type} --config ... --suggest`.")
    return False


class TpuPod:
    """One named TPU (VM or queued resource) and the training run on it."""

    def __init__(self, args: argparse.Namespace, run: Runner, sleep: Callable[[float], None] = time.sleep):
        self.a, self.run, self.sleep = args, run, sleep
        self.kind = "queued" if args.queued else "vm"

    # -- gcloud ---------------------------------------------------------------------------------------------------
    def gcloud(self, *words: str) -> list[str]:
        cmd = ["gcloud", "compute", "tpus", *words, f"--zone={self.a.zone}"]
        return cmd + ([f"--project={self.a.project}"] if self.a.project else [])

    def ssh(self, remote: str, worker: str = "all") -> list[str]:
        return self.gcloud("tpu-vm", "ssh", self.a.name, f"--worker={worker}", f"--command={remote}")

    def state(self) -> str:
        """READY / ACTIVE when usable, a GONE state after preemption, 'MISSING' when there is no such TPU."""
        if self.kind == "queued":
            cmd = self.gcloud("queued-resources", "describe", self.a.name, "--format=value(state.state)")
        else:
            cmd = self.gcloud("tpu-vm", "describe", self.a.name, "--format=value(state)")
        r = self.run(cmd, capture=True)
        return (r.stdout or "").strip().upper() if r.returncode == 0 and (r.stdout or "").strip() else "MISSING"

    # -- lifecycle --------------------------------------------------------------------------------------------------
    def create(self) -> None:
        a = self.a
        runtime = a.runtime_version or default_runtime(a.accelerator_type)
        if self.kind == "queued":
            cmd = self.gcloud("queued-resources", "create", a.name, f"--node-id={a.name}",
                              f"--accelerator-type={a.accelerator_type}", f"--runtime-version={runtime}")
        else:
            cmd = self.gcloud("tpu-vm", "create", a.name, f"--accelerator-type={a.accelerator_type}",
                              f"--version={runtime}")
        cmd += ["--spot"] if a.spot else []
        cmd += ["--preemptible"] if a.preemptible else []
        r = self.run(cmd)
        if r.returncode != 0:
            raise RuntimeError(f"creating {a.name} failed (exit {r.returncode}); see the gcloud error above")

    def delete(self) -> None:
        if self.kind == "queued":  # --force also deletes the TPU VM the queued resource holds
            self.run(self.gcloud("queued-resources", "delete", self.a.name, "--force", "--quiet"))
        else:
            self.run(self.gcloud("tpu-vm", "delete", self.a.name, "--quiet"))

    def ensure_ready(self) -> bool:
        """Creates (or recreates after preemption) the TPU and waits until it is usable; True if it is new."""
        fresh = False
        deadline = time.monotonic() + self.a.ready_timeout
        while True:
            state = self.state()
            if state == READY[self.kind]:
                return fresh
            if state in GONE:
                self.run.say(f"[tpu_vm] {self.a.name} is {state}: deleting it to create it again")
                self.delete()
                state = "MISSING"
            if state == "MISSING":
                self.create()
                fresh = True
                if self.run.dry_run:  # a dry run never sees the TPU come up
                    return fresh
                continue
            if time.monotonic() > deadline:  # e.g. WAITING_FOR_RESOURCES for longer than the user accepts
                raise RuntimeError(f"{self.a.name} still {state} after {self.a.ready_timeout:.0f}s")
            self.run.say(f"[tpu_vm] {self.a.name} is {state}; waiting")
            self.sleep(self.a.poll_s)

    # -- software and training -------------------------------------------------------------------------------------
    def setup(self) -> None:
        """This checkout's HEAD (or --git-url/--git-ref) on every worker, installed into a venv with jax[tpu]."""
        a = self.a
        py = a.worker_python
        get_python = (f"command -v {py} >/dev/null || (sudo apt-get update -qq && "
                      f"sudo apt-get install -y -qq {py} {py}-venv)")
        if a.git_url:
            # Exactly the requested ref, also on a reused VM: `checkout main` would stay on its old local branch.
            # (A tree shipped by git archive has no .git: it is replaced by a clone.)
            fetch = (f"(test -d {REMOTE_REPO}/.git || (rm -rf {REMOTE_REPO} && git clone -q "
                     f"{shlex.quote(a.git_url)} {REMOTE_REPO})) && "
                     f"git -C {REMOTE_REPO} fetch -q origin {shlex.quote(a.git_ref)} && "
                     f"git -C {REMOTE_REPO} checkout -q --force FETCH_HEAD")
        else:
            archive = f"/tmp/vit_jax-{a.name}.tar.gz"
            r = self.run(["git", "-C", str(REPO), "archive", "--format=tar.gz", "-o", archive, "HEAD"])
            if r.returncode != 0:
                raise RuntimeError("git archive failed: setup ships this checkout's HEAD (commit your changes)")
            self.run(self.gcloud("tpu-vm", "scp", archive, f"{a.name}:vit_jax.tar.gz", "--worker=all"))
            fetch = f"rm -rf {REMOTE_REPO} && mkdir -p {REMOTE_REPO} && tar -xzf ~/vit_jax.tar.gz -C {REMOTE_REPO}"
        install = (f"(test -x {REMOTE_VENV}/bin/python || {py} -m venv {REMOTE_VENV}) && "
                   f"{REMOTE_VENV}/bin/pip install -q --upgrade pip && "
                   f"cd {REMOTE_REPO} && {REMOTE_VENV}/bin/pip install -q -e '.[tpu]'")
        r = self.run(self.ssh(f"set -e; {get_python}; {fetch}; {install}"))
        if r.returncode != 0:
            raise RuntimeError(f"setup failed on at least one worker (exit {r.returncode})")

    def train_command(self) -> str:
        """What every worker runs: the trainer (pid recorded for `stop`), its output kept in a log and streamed."""
        # The interpreter path stays unquoted so that the remote shell expands its '~'.
        trainer = f"{REMOTE_VENV}/bin/python -m vit_jax.main " + shlex.join([f"--workdir={self.a.workdir}",
                                                                             *self.a.trainer_args])
        pidfile = f"{REMOTE_LOGS}/train.pid"
        stale = (f"old=$(cat {pidfile} 2>/dev/null); if [ -n \"$old\" ] && ps -p \"$old\" -o args= | grep -q "
                 f"vit_jax.main; then kill -9 \"$old\"; sleep 2; fi")  # a previous run still holding the TPU
        env = "VIT_JAX_DISTRIBUTED=auto TF_CPP_MIN_LOG_LEVEL=3"
        return (f"mkdir -p {REMOTE_LOGS}; rm -f {STOP_MARKER}; {stale}; cd {REMOTE_REPO} && set -o pipefail && "
                f"(echo $BASHPID > {pidfile}; exec env {env} {trainer}) 2>&1 "
                f"| tee -a {REMOTE_LOGS}/train.log | sed -u \"s/^/[$(hostname)] /\"")

    def train(self) -> int:
        """Runs the training on all workers in the foreground (output streamed); returns the ssh exit status."""
        return self.run(self.ssh(self.train_command())).returncode

    def finished(self) -> bool:
        """The trainer writes summary.json only when the run reached its last step."""
        r = self.run(["gcloud", "storage", "ls", f"{self.a.workdir.rstrip('/')}/summary.json"], capture=True)
        return r.returncode == 0

    def latest_checkpoint(self) -> int:
        """Step of the newest complete checkpoint in the workdir (-1: none). Orbax names it by the step only once
        it is complete (an interrupted save stays `N.orbax-checkpoint-tmp-*`)."""
        r = self.run(["gcloud", "storage", "ls", f"{self.a.workdir.rstrip('/')}/checkpoints/"], capture=True)
        steps = [int(m.group(1)) for line in (r.stdout or "").splitlines()
                 if (m := re.fullmatch(r".*/checkpoints/(\d+)/?", line.strip()))]
        return max(steps, default=-1) if r.returncode == 0 else -1

    def stop_requested(self) -> bool:
        """Whether `stop` ended this run (its marker is on worker 0)."""
        return self.run(self.ssh(f"test -f {STOP_MARKER}", worker="0"), capture=True).returncode == 0

    def launch(self) -> int:
        """create + setup + run; with --relaunch, after a preemption or a stop before the end: again (resumes)."""
        a = self.a
        preemptions = failures = 0
        best_step = -1  # the newest checkpoint seen after a run: a rerun that adds one made progress
        needs_setup = not a.skip_setup
        while True:
            if self.ensure_ready() or needs_setup:  # once per (re)created TPU, not per rerun
                self.setup()
                needs_setup = False
            rc = self.train()
            done = self.finished()
            if self.run.dry_run:
                return 0
            if done:
                self.run.say(f"[tpu_vm] training finished: {a.workdir}/summary.json")
                if a.delete_when_done:
                    self.delete()
                return 0
            if not a.relaunch:
                self.run.say(f"[tpu_vm] training stopped before the end ({exit_reason(rc)}); rerun to resume")
                return rc or 1
            step = self.latest_checkpoint()
            progressed, best_step = step > best_step, max(step, best_step)
            self.sleep(a.retry_wait)  # before looking for a stop marker, so that a `stop` during the wait counts
            state = self.state()
            if state != READY[self.kind]:
                preemptions += 1
                self.run.say(f"[tpu_vm] {a.name} is {state} (preemption {preemptions}): recreating, then resuming")
                if preemptions > a.max_preemptions:
                    return 1
                continue
            if self.stop_requested():
                self.run.say(f"[tpu_vm] stopped by `tpu_vm.py stop` (exit {rc}): not relaunching; run `launch` "
                             "again to resume")
                return 0
            # Count only reruns in a row that add no checkpoint: maintenance events over a long run are no failure.
            failures = 1 if progressed else failures + 1
            self.run.say(f"[tpu_vm] training stopped before the end ({exit_reason(rc)}), TPU still {state}, latest "
                         f"checkpoint {step if step >= 0 else 'none'}: retry {failures}/{a.max_restarts} since "
                         "the last new checkpoint")
            if failures > a.max_restarts:
                return rc or 1

    def logs(self) -> int:
        follow = "-F " if self.a.follow else ""
        return self.run(self.ssh(f"tail -n {self.a.lines} {follow}{REMOTE_LOGS}/train.log", self.a.worker)).returncode

    def stop(self) -> int:
        """SIGTERM to the trainer on every worker: it saves a checkpoint at one common step and exits 0. The marker
        tells a `launch --relaunch` loop (in another terminal) that this is no failure to retry."""
        return self.run(self.ssh(f"mkdir -p {REMOTE_LOGS} && touch {STOP_MARKER}; "
                                 f"kill -TERM $(cat {REMOTE_LOGS}/train.pid)")).returncode


# ---------------------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("create", "setup", "run", "launch", "logs", "stop", "status", "delete"))
    p.add_argument("--name", required=True, help="TPU (and queued resource) name")
    p.add_argument("--zone", required=True)
    p.add_argument("--project", default="")
    p.add_argument("--accelerator-type", default="", help="e.g. v4-32, v5p-128, v5litepod-16, v6e-64")
    p.add_argument("--runtime-version", default="", help="default: by TPU generation")
    p.add_argument("--queued", action="store_true", help="request the TPU as a queued resource")
    p.add_argument("--spot", action="store_true", help="Spot TPU (cheaper, preemptible at any time)")
    p.add_argument("--preemptible", action="store_true", help="preemptible TPU VM (older model than --spot)")
    p.add_argument("--workdir", default="", help="gs://bucket/path: checkpoints and metrics (resume needs it)")
    p.add_argument("--relaunch", action="store_true", help="launch: recreate and resume after preemption")
    p.add_argument("--max-preemptions", type=int, default=100)
    p.add_argument("--max-restarts", type=int, default=3,
                   help="reruns on a healthy TPU in a row without a new checkpoint")
    p.add_argument("--retry-wait", type=float, default=60.0, help="seconds between relaunches")
    p.add_argument("--ready-timeout", type=float, default=24 * 3600.0, help="how long to wait for the TPU")
    p.add_argument("--poll-s", type=float, default=30.0)
    p.add_argument("--delete-when-done", action="store_true")
    p.add_argument("--skip-setup", action="store_true", help="launch: the workers already have this code")
    p.add_argument("--git-url", default="", help="setup: clone this repository instead of shipping this checkout")
    p.add_argument("--git-ref", default="main")
    p.add_argument("--worker-python", default="python3.11", help="interpreter for the venv on the workers")
    p.add_argument("--worker", default="0", help="logs: worker index or 'all'")
    p.add_argument("--lines", type=int, default=100)
    p.add_argument("--follow", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    p.add_argument("--preflight", action="store_true",
                   help="create/launch: first compile the run for --accelerator-type here (TPU compiler, no TPU "
                        "needed) and stop if it does not fit")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = build_parser()
    args = parser.parse_args(argv[:split])
    args.trainer_args = argv[split + 1:]
    if args.command in ("create", "launch"):
        if not args.accelerator_type:
            parser.error("--accelerator-type is required to create a TPU (e.g. v4-32)")
        try:
            parse_accelerator(args.accelerator_type)
        except ValueError as e:
            parser.error(str(e))
        if args.queued and args.preemptible:
            parser.error("queued resources take --spot, not --preemptible")
    if args.command in ("run", "launch"):
        if not args.workdir.startswith("gs://"):
            parser.error("--workdir must be a gs:// path: every worker writes there, and it outlives a preempted VM")
        if any(a.startswith(("--workdir", "--config.distributed.")) for a in args.trainer_args):
            parser.error("pass --workdir to tpu_vm.py, and no --config.distributed.* flags: JAX reads the pod")
    return args


def main(argv: Sequence[str] | None = None, runner: Runner | None = None,
         sleep: Callable[[float], None] = time.sleep) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    run = runner or Runner(dry_run=args.dry_run)
    pod = TpuPod(args, run, sleep)
    if args.accelerator_type and args.command in ("create", "launch"):
        run.say(f"# {args.accelerator_type}: {num_workers(args.accelerator_type)} worker(s), one JAX process each; "
                f"runtime {args.runtime_version or default_runtime(args.accelerator_type)}"
                f"{', spot' if args.spot else ''}{', queued resource' if args.queued else ''}")
    try:
        if args.preflight and args.command in ("create", "launch") and not preflight(args, run.say):
            return 3
        if args.command == "create":
            pod.ensure_ready()
            return 0
        if args.command == "setup":
            pod.setup()
            return 0
        if args.command == "run":
            return pod.train()
        if args.command == "launch":
            code = pod.launch()
            if args.dry_run and args.relaunch:
                run.say(f"# --relaunch: when the TPU is preempted ({'/'.join(sorted(GONE))}), delete and recreate "
                        f"it, set it up, and run the same command again; the trainer resumes from the latest "
                        f"checkpoint in {args.workdir}. Until gs://.../summary.json exists.")
                run.say(f"# A worker that loses a peer (killed, out of memory, host down) exits {LOST_PEER_EXIT_CODE} "
                        "within distributed.heartbeat_timeout_s, its log naming the peer; the run is then retried on "
                        "the same TPU (--max-restarts reruns in a row without a new checkpoint).")
            return code
        if args.command == "logs":
            return pod.logs()
        if args.command == "stop":
            return pod.stop()
        if args.command == "status":
            print(pod.state())
            return 0
        pod.delete()
        return 0
    except RuntimeError as e:
        print(f"tpu_vm.py: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
