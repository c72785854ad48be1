"""Training entry point: `python -m vit_jax.main --config=configs/demo.py[:args] --workdir=DIR [--config.key=v]`.

Also `vit-jax train ...`. Rerunning the same command in the same workdir resumes from the latest checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS
_CONFIG = config_flags.DEFINE_config_file("config", None, "training config file (configs/*.py[:args])",
                                          lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "directory for checkpoints, metrics, summary.json")
_VERBOSE = flags.DEFINE_bool("verbose", False, "show the tracebacks and library logs of errors and of recovered "
                             "faults (same as VIT_JAX_DEBUG=1)")


def _check_before_any_work(config, workdir: str | None) -> None:
    """The mistakes that can be found from the command line alone fail here, in one line, before anything prints or
    is built: the distributed start-up, the JAX backend and a first use's dataset preparation all come later (on a
    fresh machine a wrong model variant used to arrive after a page of TFDS build output)."""
    from vit_jax.errors import UserError
    from vit_jax.train import config as config_lib

    if config is None:
        raise UserError("--config is required, e.g. --config=configs/demo.py (configs/ lists the shipped ones)")
    if not config.get("stages"):  # a staged config is checked stage by stage (train/stages.py)
        config_lib.validate(config)
        if config.model.variant or not config.init.checkpoint:  # else the architecture comes from the checkpoint
            config_lib.model_config(config, num_classes=1)  # the head size is the dataset's: any size checks the rest
    if not workdir:
        raise UserError("--workdir is required: the folder for checkpoints, metrics and summary.json (rerunning in "
                        "the same folder resumes)")


def _main(argv: list[str]) -> None:
    del argv
    from absl import logging

    from vit_jax.errors import UserError, report

    if _VERBOSE.value:
        from vit_jax.cli_args import set_verbose

        set_verbose()
    if not FLAGS["verbosity"].present:  # Orbax and friends log every file operation at INFO
        logging.set_verbosity(logging.WARNING)
    workdir = _WORKDIR.value
    try:
        config = _config_value()
        _check_before_any_work(config, workdir)
    except UserError as e:
        sys.exit(report(e, "vit-jax train"))
    # Multi-process start-up and device simulation must precede any JAX computation.
    from vit_jax.parallel.distributed import initialize
    from vit_jax.runtime import configure_jax, hide_accelerators_from_tensorflow

    configure_jax(num_cpu_devices=config.get("num_cpu_devices") or None)
    d = config.distributed
    initialize(d.coordinator, d.num_processes, d.process_id, d.heartbeat_timeout_s, d.initialization_timeout_s)
    hide_accelerators_from_tensorflow()
    from vit_jax.train.trainer import Trainer

    try:
        if config.get("stages"):
            from vit_jax.train.stages import run_stages

            result = run_stages(config, workdir, lambda c, w: Trainer(c, w).train())
        else:
            result = Trainer(config, workdir).train()
    except UserError as e:
        from vit_jax.parallel import watchdog

        watchdog.fail_fast(e)  # a multi-process job: every process stops, naming this one (never returns there)
        sys.exit(report(e, "vit-jax train"))
    from vit_jax.storage import remote

    if recovered := remote.recovered_summary():  # the faults retried along the way, each silent when it happened
        import jax

        print(f"process {jax.process_index()}: {recovered}" if jax.process_count() > 1 else recovered, flush=True)
    if result.get("status") == "preempted":  # saved: 0 after SIGTERM (preemption), 130 after Ctrl-C, as shells do
        sys.exit(128 + signal.SIGINT if result.get("signal") == signal.SIGINT else 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    from vit_jax.train.config import ConfigError, check_override_keys

    try:
        check_override_keys(argv[1:])
    except ConfigError as e:
        from vit_jax.errors import report

        return report(e, "vit-jax train")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    app.run(_main, argv=argv, flags_parser=_parse_flags)
    return 0


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with its errors (an unknown flag, a config file that does not execute) as the one line
    and exit status 2 of every other usage error, instead of absl's "FATAL Flags parsing error" and 1 or a
    traceback from inside the config loader."""
    from vit_jax.errors import ConfigError, UserError, report

    try:
        return FLAGS(argv)
    except flags.Error as e:
        sys.exit(report(UserError(str(e)), "vit-jax train"))
    except Exception as e:  # noqa: BLE001 - the config file failed to execute: not Python, a syntax error, its own bug
        path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), "the config file")
        error = ConfigError(f"--config {path} could not be loaded: {type(e).__name__}: {e}")
        sys.exit(report(error.with_traceback(e.__traceback__), "vit-jax train"))


def _config_value():
    """The parsed config; a file that does not exist is one line (ml_collections defers its IOError to here)."""
    from vit_jax.errors import MissingInputError

    config = _CONFIG.value
    try:
        config is None or config.get  # noqa: B018 - a file that failed to load raises on first use
        return config
    except OSError:
        raise MissingInputError(f"--config {FLAGS['config'].serialize().split('=', 1)[-1]}: no such config file "
                                "(configs/ lists the shipped ones)") from None


if __name__ == "__main__":
    sys.exit(main())
