"""The `vit-jax` command: one entry point, subcommands implemented by the modules that own them.

Each subcommand module exposes `main(argv: list[str]) -> int | None` and parses its own arguments, so
`vit-jax --help` stays fast (nothing heavy is imported until a command runs).
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("vit_jax.main", "train / fine-tune / evaluate from a config (same as python -m vit_jax.main)"),
    "convert": ("vit_jax.commands.convert", "convert a checkpoint between official, big_vision and timm layouts"),
    "predict": ("vit_jax.commands.predict", "run a checkpoint on images and write logits"),
    "prepare-data": ("vit_jax.commands.prepare_data", "prepare a dataset (digits, imagenet21k, image folders, TFDS) on disk"),
    "bench": ("vit_jax.bench", "benchmarks: bench data | train | eval"),
    "plan": ("vit_jax.bench.plan", "compile the train step for a TPU slice / GPUs here: memory, roofline, collectives"),
    "eval": ("vit_jax.commands.eval", "evaluate a checkpoint: classification on a split and/or few-shot linear probes"),
    "sweep": ("vit_jax.commands.sweep", "scaling sweeps: sweep run | status | report"),
    "analyze": ("vit_jax.commands.analyze", "the paper's analyses: attention distance, posemb similarity, ..."),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: vit-jax [--verbose] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in sorted(COMMANDS.items())]
    lines += ["", "`vit-jax COMMAND --help` describes a command's arguments."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--verbose", "--debug"):  # tracebacks of errors and recovered faults (cli_args.py)
        from vit_jax.cli_args import set_verbose

        set_verbose()
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"vit-jax: unknown command '{name}'{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    from vit_jax.errors import run_reporting

    module = importlib.import_module(COMMANDS[name][0])
    return run_reporting(lambda: module.main([f"vit-jax {name}", *rest] if name == "train" else rest),
                         f"vit-jax {name}")


if __name__ == "__main__":
    sys.exit(main())
