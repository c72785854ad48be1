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
    """Runs a command's body; a UserError becomes its one line and exit status."""
    try:
        return int(fn() or 0)
    except UserError as e:
        return report(e, prog)
