"""launch/tpu_vm.py: the gcloud commands of a dry run, and the relaunch-on-preemption loop against a fake gcloud."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from launch import tpu_vm
from tests.launch.helpers import ROOT

TRAINER_ARGS = ["--config=configs/demo.py", "--config.batch_size=4096"]


def dry_run(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, str(ROOT / "launch" / "tpu_vm.py"), args[0], "--dry-run", *args[1:]],
                         text=True, capture_output=True, check=True).stdout
    return out.splitlines()


def remote(line: str) -> str:
    """The --command=... a printed `gcloud ... ssh` line runs on the workers."""
    return next(w.split("=", 1)[1] for w in shlex.split(line) if w.startswith("--command="))


@pytest.mark.parametrize("accelerator, workers", [("v4-8", 1), ("v4-32", 4), ("v5p-128", 16), ("v5litepod-16", 4),
                                                  ("v6e-8", 1), ("v6e-64", 16), ("v3-32", 4)])
def test_worker_count_of_each_slice(accelerator, workers):
    assert tpu_vm.num_workers(accelerator) == workers


def test_launch_dry_run_creates_a_spot_vm_installs_on_all_workers_and_trains_everywhere():
    lines = dry_run("launch", "--name", "vit-pod", "--zone", "us-central2-b", "--project", "proj",
                    "--accelerator-type", "v4-32", "--spot", "--relaunch", "--workdir", "gs://bkt/runs/b16", "--",
                    *TRAINER_ARGS)
    assert lines[0].startswith("# v4-32: 4 worker(s), one JAX process each; runtime tpu-ubuntu2204-base, spot")
    gcloud = [shlex.split(line) for line in lines if line.startswith("gcloud")]
    assert all("--zone=us-central2-b" in c and "--project=proj" in c for c in gcloud if c[1] == "compute")
    create = next(c for c in gcloud if c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"])
    assert {"vit-pod", "--accelerator-type=v4-32", "--version=tpu-ubuntu2204-base", "--spot"} <= set(create)
    scp = next(c for c in gcloud if c[4] == "scp")
    assert "--worker=all" in scp and "vit-pod:vit_jax.tar.gz" in scp
    ssh = [line for line in lines if " ssh " in line]
    assert len(ssh) == 2 and all("--worker=all" in shlex.split(line) for line in ssh)
    setup, train = remote(ssh[0]), remote(ssh[1])
    assert "pip install -q -e '.[tpu]'" in setup and "python3.11 -m venv ~/vit_jax_venv" in setup
    # Every worker: the same trainer command, joining the pod through JAX's TPU detection, resuming from gs://.
    assert ("exec env VIT_JAX_DISTRIBUTED=auto TF_CPP_MIN_LOG_LEVEL=3 ~/vit_jax_venv/bin/python -m vit_jax.main "
            "--workdir=gs://bkt/runs/b16 --config=configs/demo.py --config.batch_size=4096") in train
    assert "tee -a ~/vit_jax_logs/train.log" in train and "echo $BASHPID > ~/vit_jax_logs/train.pid" in train
    assert "rm -f ~/vit_jax_logs/stop_requested" in train  # a new run clears an earlier `stop`
    assert "--config.distributed" not in train  # JAX reads the pod topology itself
    # The trainer's own exit status is the run's (75 from a worker whose peer was lost), not tee's or sed's.
    assert "set -o pipefail && (echo $BASHPID" in train
    assert lines[-3] == "gcloud storage ls gs://bkt/runs/b16/summary.json"
    assert lines[-2].startswith("# --relaunch: when the TPU is preempted")
    assert lines[-1].startswith("# A worker that loses a peer (killed, out of memory, host down) exits 75 within "
                                "distributed.heartbeat_timeout_s, its log naming the peer")


def test_queued_resource_dry_runs():
    lines = dry_run("launch", "--queued", "--name", "q", "--zone", "us-east5-a", "--accelerator-type", "v5p-128",
                    "--spot", "--workdir", "gs://bkt/r", "--", *TRAINER_ARGS)
    assert lines[0].startswith("# v5p-128: 16 worker(s)") and "queued resource" in lines[0]
    assert lines[1] == "gcloud compute tpus queued-resources describe q '--format=value(state.state)' --zone=us-east5-a"
    assert lines[2] == ("gcloud compute tpus queued-resources create q --node-id=q --accelerator-type=v5p-128 "
                        "--runtime-version=v2-alpha-tpuv5 --zone=us-east5-a --spot")
    assert dry_run("delete", "--queued", "--name", "q", "--zone", "z") == [
        "gcloud compute tpus queued-resources delete q --force --quiet --zone=z"]
    assert dry_run("delete", "--name", "q", "--zone", "z") == ["gcloud compute tpus tpu-vm delete q --quiet --zone=z"]
    stop = dry_run("stop", "--name", "q", "--zone", "z")
    assert remote(stop[0]) == ("mkdir -p ~/vit_jax_logs && touch ~/vit_jax_logs/stop_requested; "
                               "kill -TERM $(cat ~/vit_jax_logs/train.pid)")


def test_setup_from_git_checks_out_exactly_the_requested_ref_even_on_a_reused_vm():
    lines = dry_run("setup", "--name", "p", "--zone", "z", "--git-url", "https://example.com/vit_jax.git",
                    "--git-ref", "v1.2")
    assert len(lines) == 1 and "scp" not in lines[0]  # nothing shipped from this checkout
    setup = remote(lines[0])
    assert ("(test -d ~/vit_jax/.git || (rm -rf ~/vit_jax && git clone -q https://example.com/vit_jax.git "
            "~/vit_jax)) && git -C ~/vit_jax fetch -q origin v1.2 && git -C ~/vit_jax checkout -q --force "
            "FETCH_HEAD; ") in setup


@pytest.mark.parametrize("args, message", [
    (["run", "--name", "n", "--zone", "z", "--workdir", "/tmp/run"], "--workdir must be a gs:// path"),
    (["launch", "--name", "n", "--zone", "z", "--workdir", "gs://b/r"], "--accelerator-type is required"),
    (["create", "--name", "n", "--zone", "z", "--accelerator-type", "v9-8"], "unknown accelerator type 'v9-8'"),
    (["run", "--name", "n", "--zone", "z", "--workdir", "gs://b/r", "--", "--config.distributed.process_id=0"],
     "no --config.distributed.* flags"),
])
def test_bad_arguments_fail_with_one_line(args, message):
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "tpu_vm.py"), *args], text=True, capture_output=True)
    assert r.returncode == 2 and message in r.stderr.splitlines()[-1]


class FakeGcloud(tpu_vm.Runner):
    """Answers like gcloud would: TPU states, training exit codes, summary.json presence, the newest checkpoint
    step after each run (None: no checkpoint) and whether `stop` left its marker come from scripts."""

    def __init__(self, states: list[str], train_codes: list[int], finished: list[bool],
                 checkpoints: list[int | None] | None = None, stopped: list[bool] | None = None):
        super().__init__(dry_run=False, say=lambda msg: None)
        self.states, self.train_codes, self.finished = states, train_codes, finished
        self.checkpoints = checkpoints if checkpoints is not None else [None] * len(train_codes)
        self.stopped = stopped if stopped is not None else [False] * len(train_codes)
        self.calls: list[str] = []

    def __call__(self, cmd, capture=False):
        line = shlex.join(cmd)
        if " describe " in line:
            kind, out, code = "describe", self.states.pop(0), 0
            code = 1 if out == "" else 0
        elif " create " in line or " delete " in line:
            kind, out, code = cmd[4], "", 0
        elif " ssh " in line and "test -f ~/vit_jax_logs/stop_requested" in line:
            kind, out, code = "stopped?", "", 0 if self.stopped.pop(0) else 1
        elif " ssh " in line:
            train = "vit_jax.main" in line
            kind, out, code = ("train", "", self.train_codes.pop(0)) if train else ("setup", "", 0)
        elif cmd[:3] == ["gcloud", "storage", "ls"] and cmd[3].endswith("/checkpoints/"):
            step = self.checkpoints.pop(0)
            # What `gcloud storage ls` lists: one prefix per step, and an unfinished save next to them.
            listing = [] if step is None else [f"{cmd[3]}{s}/" for s in (step // 2, step)]
            kind, out, code = "checkpoints?", "\n".join([*listing, f"{cmd[3]}99999.orbax-checkpoint-tmp-7/"]), 0
        elif cmd[:3] == ["gcloud", "storage", "ls"]:
            kind, out, code = "finished?", "", 0 if self.finished.pop(0) else 1
        else:  # git archive, scp
            kind, out, code = cmd[0] if cmd[0] == "git" else cmd[4], "", 0
        self.calls.append(kind if kind != "train" else f"train:{line}")
        return subprocess.CompletedProcess(cmd, code, stdout=out, stderr="")


def launch(fake: FakeGcloud, *extra: str) -> int:
    return tpu_vm.main(["launch", "--name", "p", "--zone", "z", "--accelerator-type", "v4-32", "--spot",
                        "--workdir", "gs://b/run", *extra, "--", *TRAINER_ARGS], runner=fake, sleep=lambda s: None)


def test_relaunch_recreates_a_preempted_tpu_and_reruns_the_same_command_until_finished():
    fake = FakeGcloud(states=["", "READY", "PREEMPTED", "PREEMPTED", "CREATING", "READY"],
                      train_codes=[255, 0], finished=[False, True])
    assert launch(fake, "--relaunch") == 0
    kinds = [c.split(":")[0] for c in fake.calls]
    assert kinds == ["describe", "create", "describe", "git", "scp", "setup", "train", "finished?",
                     "checkpoints?", "describe",  # after the run: PREEMPTED -> loop
                     "describe", "delete", "create", "describe", "describe", "git", "scp", "setup", "train",
                     "finished?"]
    trains = [c for c in fake.calls if c.startswith("train:")]
    assert len(trains) == 2 and trains[0] == trains[1]  # the identical command: the trainer resumes from gs://b/run


def test_a_lost_peer_is_named_as_such_and_the_run_retried():
    fake = FakeGcloud(states=["READY"] * 10, train_codes=[tpu_vm.LOST_PEER_EXIT_CODE, 0], finished=[False, True],
                      checkpoints=[100])
    said: list[str] = []
    fake.say = said.append
    assert launch(fake, "--relaunch") == 0
    assert sum(c.startswith("train:") for c in fake.calls) == 2
    assert any(line.startswith("[tpu_vm] training stopped before the end (exit 75: a worker lost a peer; the line "
                               "'vit_jax watchdog: lost peer ...' above names it), TPU still READY") for line in said)


def test_failures_on_a_healthy_tpu_are_retried_then_reported():
    fake = FakeGcloud(states=["READY"] * 10, train_codes=[1, 1, 1], finished=[False] * 3)
    assert launch(fake, "--relaunch", "--max-restarts", "2") == 1
    assert sum(c.startswith("train:") for c in fake.calls) == 3
    assert fake.calls.count("setup") == 1  # an existing, healthy TPU is set up once
    assert fake.calls.count("stopped?") == 3  # each stop was checked for a `tpu_vm.py stop`


def test_only_reruns_without_a_new_checkpoint_count_as_failures():
    # Maintenance events on a healthy TPU: each run saves and exits 0. While checkpoints advance, it goes on.
    fake = FakeGcloud(states=["READY"] * 20, train_codes=[0] * 6, finished=[False] * 5 + [True],
                      checkpoints=[None, 100, 200, 300, 400])
    assert launch(fake, "--relaunch", "--max-restarts", "1") == 0
    assert sum(c.startswith("train:") for c in fake.calls) == 6
    # ... but --max-restarts reruns in a row that add none end the launch.
    fake = FakeGcloud(states=["READY"] * 20, train_codes=[0] * 4, finished=[False] * 4,
                      checkpoints=[100, 200, 200, 200])
    assert launch(fake, "--relaunch", "--max-restarts", "2") == 1
    assert sum(c.startswith("train:") for c in fake.calls) == 4


def test_a_stop_from_another_terminal_is_not_relaunched():
    fake = FakeGcloud(states=["READY"] * 10, train_codes=[0, 0], finished=[False, False], checkpoints=[100, 200],
                      stopped=[False, True])  # a maintenance event, then `tpu_vm.py stop`
    assert launch(fake, "--relaunch") == 0
    assert sum(c.startswith("train:") for c in fake.calls) == 2 and fake.calls[-1] == "stopped?"


def test_without_relaunch_a_stop_before_the_end_is_reported():
    fake = FakeGcloud(states=["READY"], train_codes=[0], finished=[False])
    assert launch(fake) == 1


# --preflight: the run is compiled for the pod's topology here (the real planner and TPU compiler, v4-8 = 4 chips of
# 32 GiB); only the gcloud side is faked.
DEMO = ["--config=configs/demo.py"]
SMALL = [*DEMO, "--config.model.depth=1", "--config.model.width=32", "--config.model.mlp_dim=64",
         "--config.model.num_heads=2"]  # compiles in seconds
# The demo model at 224 px with 4x4 patches: 3136 tokens, whose attention alone needs terabytes at batch 4096.
TOO_BIG = [*DEMO, "--config.model.image_size=224", "--config.batch_size=4096"]


def preflight_launch(fake: FakeGcloud, trainer_args: list[str]) -> tuple[int, list[str]]:
    said: list[str] = []
    fake.say = said.append
    code = tpu_vm.main(["launch", "--preflight", "--skip-setup", "--name", "p", "--zone", "z", "--accelerator-type",
                        "v4-8", "--workdir", "gs://b/run", "--", *trainer_args], runner=fake, sleep=lambda s: None)
    return code, said


@pytest.mark.slow
def test_preflight_refuses_to_create_a_pod_the_run_does_not_fit():
    fake = FakeGcloud(states=[], train_codes=[], finished=[])
    code, said = preflight_launch(fake, TOO_BIG)
    assert code == 3 and fake.calls == []  # not even a `describe`: nothing is created or started
    report = next(line for line in said if "does NOT fit" in line)
    assert "v4-8 (TPU v4, 32768 MiB per device)" in report and "Ran out of memory" in report
    assert "Not creating or starting anything" in report


@pytest.mark.slow
def test_preflight_lets_a_run_that_fits_go_ahead():
    fake = FakeGcloud(states=["READY"], train_codes=[0], finished=[True])
    code, said = preflight_launch(fake, SMALL)
    assert code == 0, said
    assert [c.split(":")[0] for c in fake.calls] == ["describe", "train", "finished?"]
    assert any(line.startswith("[tpu_vm] preflight: ") and " -> fits " in line for line in said)


def test_preflight_needs_the_trainer_config():
    with pytest.raises(RuntimeError, match="--preflight needs the trainer's --config"):
        tpu_vm.planner_command("v4-8", ["--config.batch_size=8"], "/tmp/x.json")
    cmd = tpu_vm.planner_command("v4-8", [*DEMO, "--config.batch_size=64", "--other=1"], "/tmp/x.json", python="py")
    assert cmd == ["py", "-m", "vit_jax.bench.plan", "--topology", "v4-8", "--compiler", "tpu", "--config",
                   "configs/demo.py", "--config.batch_size=64", "--output", "/tmp/x.json"]
