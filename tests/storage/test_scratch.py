"""Private scratch folders (vit_jax/storage/scratch.py): a process killed with SIGKILL leaves its spool behind, and the
next spool made on the host deletes it; nothing of a running process, another host or another name is touched."""

import os
import signal
import subprocess
import sys

from tests.launch.helpers import ROOT, job_env
from vit_jax.storage import scratch

PREFIX = "vit_jax_spool_"


def holder(parent) -> subprocess.Popen:
    """A real process that makes its scratch folder, says where, and waits to be killed."""
    code = ("import sys, time; from vit_jax.storage.scratch import make_private_dir; "
            f"print(make_private_dir({PREFIX!r}, sys.argv[1]), flush=True); time.sleep(600)")
    return subprocess.Popen([sys.executable, "-c", code, str(parent)], stdout=subprocess.PIPE, text=True,
                            env=job_env(), cwd=ROOT)


def test_the_folder_of_a_sigkilled_process_is_deleted_by_the_next_one_made_and_a_running_ones_is_kept(tmp_path):
    killed, running = holder(tmp_path), holder(tmp_path)
    try:
        killed_dir, running_dir = killed.stdout.readline().strip(), running.stdout.readline().strip()
        for d in (killed_dir, running_dir):
            assert os.path.dirname(d) == str(tmp_path)
        open(os.path.join(killed_dir, "000000_shard.array_record"), "wb").write(b"x" * 1000)  # a fetched file
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=60)
        assert os.path.isdir(killed_dir)  # SIGKILL: no atexit, the folder stays behind
        # Names this must never delete: another host's (a shared VIT_JAX_SPOOL_DIR), another prefix's, another form.
        others = [tmp_path / f"{PREFIX}other-host_{killed.pid}_abcdefgh", tmp_path / f"vit_jax_tb_{scratch.host_tag()}_"
                  f"{killed.pid}_abcdefgh", tmp_path / f"{PREFIX}k2j4h5g6", tmp_path / f"{PREFIX}{scratch.host_tag()}_x_1"]
        for d in others:
            d.mkdir()

        mine = scratch.make_private_dir(PREFIX, str(tmp_path))
        assert not os.path.exists(killed_dir)
        assert os.path.isdir(running_dir) and os.path.isdir(mine) and all(d.is_dir() for d in others)
        assert os.path.basename(mine).startswith(f"{PREFIX}{scratch.host_tag()}_{os.getpid()}_")
        assert scratch.remove_stale(PREFIX, str(tmp_path)) == []  # its own folder is not stale either
    finally:
        for p in (killed, running):
            p.kill()
            p.wait(timeout=60)
    assert scratch.remove_stale(PREFIX, str(tmp_path)) == [running_dir]  # ended now, without cleaning up


def test_a_missing_parent_is_no_error_for_the_sweep():
    assert scratch.remove_stale(PREFIX, "/nonexistent/parent") == []
