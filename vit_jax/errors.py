"""Errors a user can cause, and how every command reports them: one line on stderr naming the fix, no traceback.

A `UserError` (a wrong config key or value, an unknown model variant or dataset, a missing or unreadable checkpoint,
an unsafe file) carries the exit status the command ends with: 2 for what the user asked for (the Unix usage-error
convention) unless the subclass says otherwise. Setting VIT_JAX_DEBUG=1 (or passing `--debug` to `vit-jax`) prints
the traceback too. Exceptions that are not UserErrors are bugs or environment failures and keep their traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable

USAGE_EXIT_CODE = 2
DIVERGED_EXIT_CODE = 3  # training stopped by the NaN guard; the last good state is saved
DEBUG_ENV = "VIT_JAX_DEBUG"


class UserError(Exception):
    """Something the user gave or asked for is wrong; `str(e)` is one line that says what to do."""

    exit_code = USAGE_EXIT_CODE


class ConfigError(UserError, ValueError):
    """A config key or value a user wrote is not valid; the message names the fix."""


class ReportedError(UserError):
    """A failure a child process (a planner worker, a benchmark peer) already reported in its own one line on stderr:
    the parent ends with the child's exit status and adds nothing (its own traceback would bury the child's line)."""

    def __init__(self, exit_code: int, what: str):
        super().__init__(f"{what} failed with exit status {exit_code} (its error is printed above)")
        self.exit_code = exit_code


def child_failure(returncode: int, what: str) -> Exception:
    """The exception for a child process that exited with `returncode`: a ReportedError when the child ended on
    purpose (1 < status < 128: a user error's status, reported by the child under `run_reporting`, or a documented
    one such as a lost peer's 75), else a RuntimeError (1: an uncaught exception, whose traceback the child printed;
    negative or >= 128: a signal)."""
    if 1 < returncode < 128:
        return ReportedError(returncode, what)
    return RuntimeError(f"{what} failed (exit {returncode}); its output is above")


class MissingInputError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist (or lacks what it must hold); a FileNotFoundError too, so code
    that handles a missing file keeps doing so."""


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def one_line(e: BaseException) -> str:
    """The first line of an exception's message (messages of wrapped library errors can run to pages)."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def report(e: UserError, prog: str) -> int:
    """Prints `prog: error: <message>` (with the traceback under VIT_JAX_DEBUG) and returns the exit status."""
    if debug_enabled():
        traceback.print_exception(e)
    print(f"{prog}: error: {one_line(e)}", file=sys.stderr, flush=True)
    return e.exit_code


def run_reporting(fn: Callable[[], int | None], prog: str) -> int:
    """Runs a command's body; a UserError becomes its one line and exit status.

    A `SystemExit("message")` (how argument checks in the benchmarks stop) is a usage error too: its message becomes
    the same one line and the status 2, not Python's bare message and status 1. A ReportedError prints nothing more.
    """
    try:
        return int(fn() or 0)
    except ReportedError as e:
        if debug_enabled():
            traceback.print_exception(e)
        return e.exit_code
    except UserError as e:
        return report(e, prog)
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise
        return report(UserError(e.code.removeprefix("error: ")).with_traceback(e.__traceback__), prog)
