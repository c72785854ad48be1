"""A real one-node SLURM cluster on localhost for the launcher tests: munged, slurmctld and slurmd (Debian's SLURM
22.05 packages) with a generated slurm.conf on free ports, everything under one temporary folder.

It installs nothing: `make test` installs the packages (slurmctld slurmd slurm-client munge) when they are missing.
It needs root, as slurmd does to start tasks. It touches no system state: its own munge key and socket (not
/etc/munge, /run/munge), state and spool folders, and it is reached only by processes given its `env` (SLURM_CONF).
docs/launching.md ("Try the SLURM launcher locally") has the same recipe as shell commands.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from launch.local import free_port

PACKAGES = "slurmctld slurmd slurm-client munge"
PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo", "squeue")

# Why each setting: a one-node cluster with the node's 2 CPUs whatever the machine has (config_overrides), no
# cgroups (proctrack/linuxproc, task/none: works in containers), no accounting database. cred_expire is also the
# delay before a requeued job may start again (SLURM's default: 120 s); sched_interval=1 starts it within a second.
# MinJobAge: a finished job's record stays readable (scontrol show job) for the whole session, not 300 s.
# KillWait: the survivors of a failed step get SIGKILL 5 s after SIGTERM, not 30 s. MessageTimeout: slurmd answers
# a step-termination request only once the step's processes are gone (up to KillWait); with the default 10 s,
# slurmctld gives up and resends it later, and a resent request can end the next attempt of a requeued job (its
# step has the same id, and cred_expire=10 starts it early). SLURM's default cred_expire (120 s) outlasts the resend.
# Two partitions: a job in `urgent` preempts the default `batch`'s jobs, which first get GraceTime seconds with
# SIGTERM to their tasks (how a scheduler asks a job to save before it takes the nodes).
SLURM_CONF = """\
ClusterName=vitjaxtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket,cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
JobRequeue=1
MinJobAge=86400
MessageTimeout=60
KillWait=5
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE PriorityTier=1 PreemptMode=CANCEL GraceTime=30 State=UP
PartitionName=urgent Nodes=ALL MaxTime=INFINITE PriorityTier=2 PreemptMode=OFF State=UP
"""


class ClusterError(RuntimeError):
    """The local cluster cannot start here; the message says why and what to do."""


def missing_requirements() -> str | None:
    """Why the cluster cannot start on this machine (one line), or None."""
    if os.geteuid() != 0:
        return ("the SLURM launcher tests start a local SLURM cluster, whose slurmd must run as root: run them as "
                f"root (`sudo make test` also installs the Debian packages {PACKAGES})")
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return (f"the SLURM launcher tests start a local SLURM cluster but {', '.join(missing)} is not installed: "
                f"run `make test` (it installs the Debian packages) or `apt-get install {PACKAGES}`")
    return None


class LocalSlurmCluster:
    """munged + slurmctld + slurmd under `root`; `start()` waits for the node to be idle, `stop()` ends everything."""

    def __init__(self, root: Path, cpus: int = 2):
        self.root = Path(root)
        self.cpus = cpus
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.daemons: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to use this cluster (and only it): add to its environment."""
        return {"SLURM_CONF": str(self.conf)}

    # -- life cycle ---------------------------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> "LocalSlurmCluster":
        if why := missing_requirements():
            raise ClusterError(why)
        try:
            socket.gethostbyname(self.host)  # JAX's coordinator address under SLURM is the first node's name
        except OSError as e:
            raise ClusterError(f"this machine's name {self.host!r} does not resolve ({e}); add it to /etc/hosts")
        for sub in ("state", "spool", "log", "munge", "munge/key"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o755)  # clients reach the socket through it
        (self.root / "munge/key").chmod(0o700)
        key = self.root / "munge/key/munge.key"
        self._check([shutil.which("mungekey"), "--create", "--force", f"--keyfile={key}"])
        self.conf.write_text(SLURM_CONF.format(host=self.host, root=self.root, cpus=self.cpus,
                                               ctld_port=free_port(), slurmd_port=free_port()))
        try:
            # --force: munged refuses world-writable ancestors of its socket (the temporary folder) otherwise.
            self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.root}/munge/munge.socket",
                                   f"--key-file={key}", f"--pid-file={self.root}/munge/munged.pid",
                                   f"--seed-file={self.root}/munge/munged.seed",
                                   f"--log-file={self.root}/log/munged.log"])
            self._wait(lambda: (self.root / "munge/munge.socket").exists(), timeout, "munged to open its socket")
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
            self._wait(lambda: self.node_state() == "idle", timeout, "the node to be idle (sinfo)")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 60.0) -> list[int]:
        """Cancels every job, waits for them to end (their steps report to slurmd), then stops the daemons by PID.
        Returns the job processes that were still running then (killed now): a leak to report."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            jobs = self.job_ids()
            if jobs:
                self.run("scancel", *jobs, check=False)
                try:
                    self._wait(lambda: not self.job_ids(), timeout, "the cancelled jobs to end")
                except ClusterError:
                    pass  # the stray processes are killed below
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.daemons.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)
        deadline = time.monotonic() + 10  # a slurmstepd may still be exiting after its job left the queue
        while (stray := self.stray_pids()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in stray:  # job processes of ours that outlived their slurmstepd
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return stray

    def stray_pids(self) -> list[int]:
        """Processes started by this cluster (they inherit its SLURM_CONF) that are still running."""
        marker = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if marker in (entry / "environ").read_bytes().split(b"\0"):
                        pids.append(int(entry.name))
                except OSError:
                    pass
        return pids

    # -- commands -----------------------------------------------------------------------------------------------------
    def run(self, *command: str, check: bool = True, env: dict[str, str] | None = None) -> str:
        """Runs a SLURM client command against this cluster; returns its stdout."""
        r = subprocess.run(command, env={**(env or os.environ), **self.env}, text=True, capture_output=True,
                           timeout=60)
        if check and r.returncode != 0:
            raise ClusterError(f"{' '.join(command)} exited with {r.returncode}: {r.stderr.strip()}")
        return r.stdout

    def node_state(self) -> str:
        return self.run("sinfo", "--noheader", "--format=%t", check=False).strip()

    def job_ids(self) -> list[str]:
        return self.run("squeue", "--noheader", "--format=%i", check=False).split()

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, Comment, RunTime, ...); {} once it is gone."""
        out = self.run("scontrol", "show", "job", "--oneliner", job_id, check=False)
        return {k: v.strip() for k, v in re.findall(r"(\w+)=(.*?)(?= \w+=|$)", out.strip())}

    def wait_for_job(self, job_id: str, states: tuple[str, ...], timeout: float) -> dict[str, str]:
        """The job's record once its state is one of `states` (e.g. COMPLETED, FAILED)."""
        self._wait(lambda: self.job(job_id).get("JobState") in states, timeout,
                   f"job {job_id} to be {' or '.join(states)} (now {self.job(job_id).get('JobState')})")
        return self.job(job_id)

    # -- helpers ------------------------------------------------------------------------------------------------------
    def _spawn(self, name: str, command: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        self.daemons[name] = subprocess.Popen(command, env={**os.environ, **self.env}, stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True)
        log.close()

    def _check(self, command: list[str]) -> None:
        r = subprocess.run(command, text=True, capture_output=True, timeout=60)
        if r.returncode != 0:
            raise ClusterError(f"{' '.join(command)} exited with {r.returncode}: {r.stderr.strip()}")

    def _wait(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    log = (self.root / "log" / f"{name}.out").read_text(errors="replace").strip().splitlines()
                    raise ClusterError(f"{name} exited with {proc.returncode} while waiting for {what}: "
                                       f"{log[-1] if log else 'no output'}")
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)
