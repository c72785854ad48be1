"""Multi-stage runs: one config, one workdir, several trainings in order (pretrain, then fine-tune from it, ...).

A config with `stages` is a recipe of runs of the one trainer: each stage is the config itself with the stage's
overrides (dotted keys, as `--config.a.b=v` would set them), trained in `WORKDIR/<stage name>`. A string value may
name the workdir as `{workdir}`, so a stage can start from an earlier one (`init.checkpoint="{workdir}/pretrain"`).
Every stage's config is built and validated before the first trains, so a mistake in the last stage costs nothing.

Rerunning the command resumes: a finished stage (its summary.json says so) is not run again, an interrupted one
resumes from its checkpoints as any run does. A stage that is preempted stops the recipe there (the command exits as
after any preemption). When every stage has finished, `WORKDIR/summary.json` holds each stage's summary and the
results the config names in `stage_results` (`(("scratch_top1", "scratch:eval/top1"),)`: a stage's final metric).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import jax
import ml_collections

from vit_jax.train import config as config_lib
from vit_jax.train import workdir as wd


def stage_configs(config: ml_collections.ConfigDict, workdir: str) -> list[tuple[str, ml_collections.ConfigDict]]:
    """[(name, the stage's config)] in order; each is validated. Errors name the stage and the key."""
    names = [stage[0] if isinstance(stage, (tuple, list)) and stage else None for stage in config.stages]
    if any(not isinstance(s, (tuple, list)) or len(s) != 2 or not isinstance(s[0], str) or not isinstance(s[1], dict)
           for s in config.stages):
        raise config_lib.ConfigError("stages: give a tuple of (name, {dotted key: value}) pairs, e.g. "
                                     "(('pretrain', {'optimizer.lr': 3e-3}), ('finetune', {...}))")
    bad = [n for n in names if not n or "/" in n or n.startswith(".")]
    if bad or len(set(names)) != len(names):
        raise config_lib.ConfigError(f"stages: names must be distinct folder names, got {names}")
    base = config.copy_and_resolve_references()
    base.stages, base.stage_results = (), ()
    out = []
    for name, overrides in config.stages:
        c = base.copy_and_resolve_references()
        for key, value in overrides.items():
            set_key(c, key, value.format(workdir=workdir) if isinstance(value, str) else value, f"stage '{name}'")
        try:
            config_lib.validate(c)
        except config_lib.ConfigError as e:
            raise config_lib.ConfigError(f"stage '{name}': {e}") from None
        out.append((name, c))
    for item in config.stage_results:
        key, ref = item if isinstance(item, (tuple, list)) and len(item) == 2 else (item, "")
        if ref.partition(":")[0] not in names or not ref.partition(":")[2]:
            raise config_lib.ConfigError(f"stage_results.{key}={ref!r}: name a stage's final metric as "
                                         f"'STAGE:METRIC' with STAGE one of {', '.join(names)}")
    return out


def set_key(c: ml_collections.ConfigDict, key: str, value: Any, where: str) -> None:
    """Sets a dotted key (`"optimizer.lr"`) of the config as `--config.optimizer.lr=` does, lists becoming tuples;
    an unknown key or a value of the wrong type is a ConfigError that starts with `where`."""
    def unknown() -> config_lib.ConfigError:  # the valid keys are listed only when one is wrong
        valid = list(config_lib._flat(config_lib.default_config()))
        return config_lib.ConfigError(f"{where}: {config_lib.unknown_key_message(key, valid)}")

    *parents, leaf = key.split(".")
    node = c
    for p in parents:
        if p not in node or not isinstance(node[p], ml_collections.ConfigDict):
            raise unknown()
        node = node[p]
    if leaf not in node or key in ("stages", "stage_results"):
        raise unknown()
    try:
        node[leaf] = tuple(value) if isinstance(value, list) else value
    except TypeError:  # ConfigDict keeps each field's type, as validate() requires
        raise config_lib.ConfigError(f"{where}: config key '{key}' must be {type(node[leaf]).__name__}, "
                                     f"got {value!r} ({type(value).__name__})") from None


def finished_summary(stage_dir: str) -> dict | None:
    """The summary of a stage that ran to its end, or None."""
    path = wd.path(stage_dir, "summary.json")
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("status") == "finished" else None


def run_stages(config: ml_collections.ConfigDict, workdir: str,
               train: Callable[[ml_collections.ConfigDict, str], dict]) -> dict[str, Any]:
    """Runs the stages in order with `train(config, workdir) -> summary` (the Trainer); returns the recipe's summary,
    or the first stage's summary that did not finish (a preemption)."""
    workdir = wd.resolve(workdir)
    stages = stage_configs(config, workdir)
    summaries: dict[str, dict] = {}
    for name, stage_config in stages:
        stage_dir = f"{workdir}/{name}"
        summary = finished_summary(stage_dir)
        if summary is None:
            _log(f"stage {name} ({len(summaries) + 1}/{len(stages)}): {stage_dir}")
            summary = train(stage_config, stage_dir)
            if summary.get("status") != "finished":
                return summary
        else:
            _log(f"stage {name} ({len(summaries) + 1}/{len(stages)}): finished already ({stage_dir})")
        summaries[name] = summary
    results = {key: summaries[ref.partition(":")[0]]["final"].get(ref.partition(":")[2])
               for key, ref in config.stage_results}
    summary = {
        "status": "finished",
        "name": workdir.rstrip("/").rsplit("/", 1)[-1],
        "workdir": workdir,
        **results,
        "stages": {name: {k: s[k] for k in ("workdir", "model", "dataset", "steps", "examples_seen", "compute",
                                            "final", "best", "wall_time_s") if k in s}
                   for name, s in summaries.items()},
        "wall_time_s": sum(s.get("wall_time_s", 0.0) for s in summaries.values()),
        "config": config.to_dict(),
    }
    if jax.process_index() == 0:
        wd.write_bytes(wd.path(workdir, "summary.json"), json.dumps(summary, indent=2, default=list).encode())
        _log("stages finished: " + ", ".join(f"{k} {_fmt(v)}" for k, v in results.items()))
    return summary


def _fmt(value: Any) -> str:
    return f"{100 * value:.2f}%" if isinstance(value, float) and 0.0 <= value <= 1.0 else str(value)


def _log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)
