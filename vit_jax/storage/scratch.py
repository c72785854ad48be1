"""Private scratch folders of a process: the spool of a streamed bucket dataset (data/spool.py, ~4 GB per process
for ImageNet-21k) and the local TensorBoard mirror of a run in a bucket (train/metrics.py).

Each process deletes its own folders when it closes them and at exit, but a process killed by SIGKILL (the OOM
killer, a scheduler's hard kill, a launcher's lost-peer kill) cannot, and a node's temp dir would fill up run after
run. So a folder is named for its host and process, `<prefix><host>_<pid>_<random>`, and making one first deletes
the folders of that prefix, in that parent, which this host's processes left behind: their process no longer runs.
A folder of another host (a shared VIT_JAX_SPOOL_DIR), of a process still running, of another user, or not named so
is never touched. (Containers that share both a hostname and a scratch parent but not their process ids could
mistake each other's folders for stale ones: give each its own VIT_JAX_SPOOL_DIR.)
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import socket
import tempfile


def host_tag() -> str:
    """This host's name as it appears in folder names: letters, digits, '.' and '-' only."""
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "host"


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def remove_stale(prefix: str, parent: str) -> list[str]:
    """Deletes the folders `<prefix><this host>_<pid>_*` in `parent` whose process is gone; returns their paths."""
    pattern = re.compile(re.escape(prefix + host_tag()) + r"_(\d+)_")
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        m = pattern.match(name)
        path = os.path.join(parent, name)
        if not m or process_alive(int(m.group(1))):  # this process's own folders included
            continue
        try:
            if not os.path.isdir(path) or os.path.islink(path) or os.stat(path).st_uid != os.getuid():
                continue
        except OSError:  # gone meanwhile (another process cleaned it)
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def make_private_dir(prefix: str, parent: str | None = None) -> str:
    """A new folder `<parent>/<prefix><host>_<pid>_<random>` (parent: the temp dir), after removing the stale ones;
    deleted at exit (its user may delete it sooner)."""
    parent = parent or tempfile.gettempdir()
    remove_stale(prefix, parent)
    path = tempfile.mkdtemp(prefix=f"{prefix}{host_tag()}_{os.getpid()}_", dir=parent)
    atexit.register(shutil.rmtree, path, True)
    return path
