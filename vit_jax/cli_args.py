"""The one flag style of every `vit-jax` command: `--dash-words`, and the flags every command shares.

prepare-data and the data benchmarks used to spell their flags `--under_scores`; those spellings are still
accepted (any `--a_b` that names a `--a-b` option of the parser), so scripts keep working for a release.

`--verbose` (every command; `vit-jax --verbose COMMAND` too): the tracebacks a command otherwise keeps to one line,
those of user errors and of faults it recovered from (a damaged checkpoint skipped, the reads a failed restore left
behind), and the library logs that come with them. The same switch as VIT_JAX_DEBUG=1.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

VERBOSE_HELP = "show the tracebacks and library logs of errors and of recovered faults (same as VIT_JAX_DEBUG=1)"


def set_verbose() -> None:
    """Turns on the switch vit_jax.errors.debug_enabled reads, for this process and the processes it starts."""
    from vit_jax.errors import DEBUG_ENV

    os.environ[DEBUG_ENV] = "1"


class _Verbose(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=VERBOSE_HELP)

    def __call__(self, parser, namespace, values, option_string=None):
        set_verbose()


# The one name of each concept across commands (#41), and the spellings it replaced: an old spelling is accepted by
# a command that has the new option (for a release), with one line on stderr naming the new one.
DEPRECATED = {"--batch": "--batch-size", "--size": "--image-size", "--heads": "--num-heads",
              "--patch": "--patch-size", "--json": "--output", "--out": "--output"}


def output_path(text: str) -> str:
    """argparse `type=` of an output flag: a path whose folder exists or can be made, so a command that cannot write
    its result stops with a usage error before any work, not with a traceback at the end. URLs are left to the
    storage layer."""
    if not text or text == "-" or "://" in text:  # none, stdout, a bucket
        return text
    parent = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {parent} is not a writable folder")
    return text


# A value of a list-valued flag that starts with a negative number: -1,1,1 / -1 / -0.5 / -1x2
_NEGATIVE_LIST = re.compile(r"^-\d[\d.]*([,x:]-?\d[\d.]*)*$")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with `--a_b` accepted for a `--a-b` option (sub-parsers made by add_subparsers are of this class),
    and the shared `--verbose` (not in the parsed namespace: it only sets the process-wide switch)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("--verbose", action=_Verbose)

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        options = {s for action in self._actions for s in action.option_strings}

        def dashed(arg: str) -> str:
            name, eq, value = arg.partition("=")
            if name.startswith("--") and "_" in name and name not in options:
                spelled = "--" + name[2:].replace("_", "-")
                if spelled in options:
                    return spelled + eq + value
            if name in DEPRECATED and name not in options and DEPRECATED[name] in options:
                print(f"{self.prog}: {name} is deprecated; use {DEPRECATED[name]}", file=sys.stderr)
                return DEPRECATED[name] + eq + value
            return arg

        end = args.index("--") if "--" in args else len(args)  # after "--" everything is a positional value
        return super().parse_known_args(self._join_negative([dashed(a) for a in args[:end]]) + args[end:], namespace)

    def _join_negative(self, args: list[str]) -> list[str]:
        """`--mesh -1,1,1` as `--mesh=-1,1,1`: argparse takes a value that starts with '-' for an option unless it is
        a plain negative number, so the documented negative lists (`-1`: all remaining devices) would be refused."""
        takes_value = {s for a in self._actions if a.nargs is None and a.option_strings for s in a.option_strings}
        out: list[str] = []
        for arg in args:
            if out and out[-1] in takes_value and _NEGATIVE_LIST.match(arg):
                out[-1] = f"{out[-1]}={arg}"
            else:
                out.append(arg)
        return out

    def error(self, message: str):
        """A usage error is one line on stderr (argparse's would add its usage block) and exit status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
