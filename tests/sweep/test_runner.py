"""`vit-jax sweep run/status`: local execution through a fake trainer, resumption, dry runs, launcher commands."""

import json
import shlex
import sys
from pathlib import Path

import pytest

from vit_jax.commands import sweep as cli
from vit_jax.sweep.launchers import ScriptLauncher, make_launcher, trainer_command
from vit_jax.sweep.runs import read_run, read_sweep_root

FAKE = Path(__file__).with_name("fake_trainer.py")


@pytest.fixture
def sweep_file(tmp_path):
    (tmp_path / "base.py").write_text("def get_config(): pass\n")
    path = tmp_path / "tiny_sweep.py"
    path.write_text(
        "def get_sweep():\n"
        "    return {'base': 'base.py', 'fixed': {'seed': 0},\n"
        "            'grid': {'model.width': [16, 32], 'total_steps': [10, 20]}}\n")
    return path


@pytest.fixture
def fake_trainer(monkeypatch):
    monkeypatch.setenv("VIT_JAX_SWEEP_TRAINER", shlex.join([sys.executable, str(FAKE)]))


def invocations(root: Path) -> list[dict]:
    path = root / "invocations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_run_executes_every_run_then_resumes_only_unfinished(sweep_file, tmp_path, fake_trainer, monkeypatch, capsys):
    root = tmp_path / "root"
    monkeypatch.setenv("FAKE_TRAINER_INTERRUPT", "model.width=32,total_steps=20")
    assert cli.main(["run", str(sweep_file), "--root", str(root)]) == 1  # one run did not finish
    first = invocations(root)
    assert sorted(i["run"] for i in first) == sorted(
        ["model.width=16,total_steps=10", "model.width=32,total_steps=10", "model.width=16,total_steps=20",
         "model.width=32,total_steps=20"])
    out = capsys.readouterr().out
    assert "[4/4] model.width=32,total_steps=20 ... failed" in out
    assert "did not finish" in out
    interrupted = root / "model.width=32,total_steps=20"
    assert read_run(interrupted).status == "failed"
    assert "fake trainer training" in (interrupted / "log.txt").read_text()  # output streamed into log.txt
    assert (root / "sweep.json").exists()

    # Second invocation: finished runs are skipped, the interrupted one re-runs with the same command.
    monkeypatch.delenv("FAKE_TRAINER_INTERRUPT")
    assert cli.main(["run", str(sweep_file), "--root", str(root)]) == 0
    second = invocations(root)[len(first):]
    assert [i["run"] for i in second] == ["model.width=32,total_steps=20"]
    assert second[0]["argv"] == next(i["argv"] for i in first if i["run"] == second[0]["run"])
    assert "--config.seed=0" in second[0]["argv"] and "--config.model.width=32" in second[0]["argv"]
    out = capsys.readouterr().out
    assert out.count("finished earlier, skipped") == 3
    attempts = read_run(interrupted).attempts
    assert [a["returncode"] for a in attempts] == [1, 0]

    # Third invocation: nothing left to do.
    assert cli.main(["run", str(sweep_file), "--root", str(root)]) == 0
    assert len(invocations(root)) == len(first) + 1
    states, problems = read_sweep_root(root)
    assert problems == [] and all(s.finished for s in states) and len(states) == 4


def test_only_selects_runs_by_glob(sweep_file, tmp_path, fake_trainer):
    root = tmp_path / "root"
    assert cli.main(["run", str(sweep_file), "--root", str(root), "--only", "*total_steps=10"]) == 0
    assert sorted(i["run"] for i in invocations(root)) == ["model.width=16,total_steps=10",
                                                          "model.width=32,total_steps=10"]
    assert cli.main(["run", str(sweep_file), "--root", str(root), "--only", "nothing*"]) == 2


def test_dry_run_prints_every_command_and_launches_nothing(sweep_file, tmp_path, fake_trainer, capsys):
    root = tmp_path / "root"
    assert cli.main(["run", str(sweep_file), "--root", str(root), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert len(commands) == 4
    assert all(c[:2] == [sys.executable, str(FAKE)] for c in commands)
    assert {c[3] for c in commands} == {f"--workdir={root}/model.width={w},total_steps={s}"
                                       for w in (16, 32) for s in (10, 20)}
    assert all(f"--config={sweep_file.parent}/base.py" == c[2] for c in commands)
    assert not root.exists()


def test_tpu_launcher_dry_run_uses_launch_script_contract(sweep_file, tmp_path, capsys, gcs):
    # A bucket root (a TPU pod's workdirs are in one): the dry run reads each run's status there.
    root = f"{gcs.bucket}/sweeps/s1"
    assert cli.main(["run", str(sweep_file), "--root", root, "--launcher=tpu", "--launcher-arg=--name=pod-1",
                     "--launcher-arg=--zone=us-central2-b", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# [1/4] model.width=16,total_steps=10: pending" in out, out
    commands = [shlex.split(line) for line in out.splitlines() if not line.startswith("#")]
    first = commands[0]
    assert first[1].endswith("launch/tpu_vm.py")
    assert first[2:7] == ["launch", f"--workdir={root}/model.width=16,total_steps=10", "--name=pod-1",
                          "--zone=us-central2-b", "--"]
    assert first[7].startswith("--config=")
    assert not any(a.startswith("--workdir") for a in first[7:])  # the launcher sets the trainer's workdir


@pytest.mark.parametrize("kind,extra", [("tpu", ["--name=pod-1", "--zone=us-central2-b", "--accelerator-type=v4-32"]),
                                        ("slurm", ["--nodes=2", "--gpus-per-node=8"])])
def test_the_real_launch_scripts_accept_the_sweep_command_lines(kind, extra, tmp_path):
    # The contract end to end: the sweep's command line, run through the actual launch/ script in dry-run mode.
    import subprocess

    launcher = make_launcher(kind, extra_args=[*extra, "--dry-run"])
    workdir = str(tmp_path / "model.width=16,total_steps=10") if kind == "slurm" else "gs://b/s/run1"
    cmd = launcher.command(["--config=configs/demo.py", f"--workdir={workdir}", "--config.total_steps=10"], workdir)
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "--config.total_steps=10" in out.stdout and workdir in out.stdout
    assert launcher.asynchronous == (kind == "slurm")


def test_missing_launch_script_is_a_clear_error(tmp_path):
    launcher = ScriptLauncher("slurm")
    launcher.script = tmp_path / "launch" / "slurm.py"
    with pytest.raises(FileNotFoundError, match="--launcher=local"):
        launcher(["--config=x.py"], str(tmp_path / "w"))
    with pytest.raises(ValueError, match="only applies"):
        make_launcher("local", extra_args=["--x"])


def test_trainer_command_default_and_override(monkeypatch):
    monkeypatch.delenv("VIT_JAX_SWEEP_TRAINER", raising=False)
    assert trainer_command() == [sys.executable, "-m", "vit_jax.main"]
    assert trainer_command("python fake.py --x") == ["python", "fake.py", "--x"]


def test_status_reports_pending_and_corrupt_runs(sweep_file, tmp_path, capsys):
    root = tmp_path / "root"
    corrupt = root / "model.width=16,total_steps=10"
    corrupt.mkdir(parents=True)
    (corrupt / "summary.json").write_text('{"status": "fini')
    assert cli.main(["status", str(sweep_file), "--root", str(root)]) == 1
    table = capsys.readouterr().out
    assert "corrupt" in table and table.count("pending") == 3


def test_ctrl_c_lets_the_trainer_save_before_the_sweep_stops(sweep_file, tmp_path):
    import os
    import signal
    import subprocess
    import time

    root = tmp_path / "root"
    env = {**os.environ, "VIT_JAX_SWEEP_TRAINER": shlex.join([sys.executable, str(FAKE)]),
           "FAKE_TRAINER_AWAIT_SIGINT": "1"}
    repo = Path(__file__).resolve().parents[2]
    # Restore SIGINT's default disposition in the child: when the test suite itself runs in a background job
    # (`cmd &` in a non-interactive shell) SIGINT is inherited as ignored, and Python then installs no
    # KeyboardInterrupt handler, which is not the interactive Ctrl-C this test is about.
    proc = subprocess.Popen([sys.executable, "-m", "vit_jax.commands.sweep", "run", str(sweep_file), "--root", str(root)],
                            cwd=repo, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ready = root / "model.width=16,total_steps=10" / "ready"
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "run the same command again to resume" in err
    assert (ready.parent / "saved").exists()  # the trainer was not killed while saving
    assert len(invocations(root)) == 1  # the sweep stopped instead of starting the next run


def test_tpu_preflight_is_passed_to_the_pod_launcher():
    launcher = make_launcher("tpu", extra_args=["--name=pod-1"], preflight=True)
    cmd = launcher.command(["--config=configs/demo.py"], "gs://b/s/run1")
    assert cmd[2:6] == ["launch", "--workdir=gs://b/s/run1", "--preflight", "--name=pod-1"]
    assert "--preflight" not in make_launcher("tpu").command(["--config=configs/demo.py"], "gs://b/s/run1")
    with pytest.raises(ValueError, match="--preflight applies to --launcher=tpu"):
        make_launcher("slurm", preflight=True)
