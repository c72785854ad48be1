"""The one flag style of every `vit-jax` command: `--dash-words`.

prepare-data and the data benchmarks used to spell their flags `--under_scores`; those spellings are still
accepted (any `--a_b` that names a `--a-b` option of the parser), so scripts keep working for a release.
"""

from __future__ import annotations

import argparse
import sys


class ArgumentParser(argparse.ArgumentParser):
    """argparse with `--a_b` accepted for a `--a-b` option (sub-parsers made by add_subparsers are of this class)."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        options = {s for action in self._actions for s in action.option_strings}

        def dashed(arg: str) -> str:
            name, eq, value = arg.partition("=")
            if name.startswith("--") and "_" in name and name not in options:
                spelled = "--" + name[2:].replace("_", "-")
                if spelled in options:
                    return spelled + eq + value
            return arg

        end = args.index("--") if "--" in args else len(args)  # after "--" everything is a positional value
        return super().parse_known_args([dashed(a) for a in args[:end]] + args[end:], namespace)
