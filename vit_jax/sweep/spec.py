"""Sweep definitions: a base training config plus a grid and/or a list of overrides, expanded into named runs.

A sweep file is a Python file with `get_sweep()` (or `get_sweep(arg)` when named as `FILE.py:ARG`) returning a dict
(or an ml_collections ConfigDict) with these entries:

    base:  "configs/demo.py" or "configs/demo.py:ARGS"  the trainer config every run starts from
    fixed: {"data.fraction": 0.5, ...}                  overrides applied to every run, not part of run names
    grid:  {"total_steps": [100, 300],                   each axis a list of values for that config key, or
            "model": {"tiny": {...}, "small": {...}}}    a {label: overrides} dict (a named group of keys)
    runs:  [{"model.variant": "B/16"}, ...]             explicit override dicts, or {label: overrides}

The runs are the cartesian product of the `runs` entries with the `grid` points (either may be absent). Keys are the
trainer's dotted config keys (`--config.KEY=VALUE`); nested dicts are flattened into dotted keys. One key is
reserved: `config_args` ("variant=L/16,epochs=7" or {"variant": "L/16"}) sets arguments of the base config file
(`base.py:variant=L/16`) instead of overrides. Use it for whatever a config file derives from its arguments (e.g.
configs/vit_i21k.py sizes the pre-logits layer, scan, remat and FSDP from `variant`): an override of
`model.variant` would leave those derived settings at the base variant's values.

A run's name comes from its overrides alone, so it is stable across invocations (resumption finds its workdir again):
`key=value` parts (or `axis=label`, or a bare `label` for a labelled `runs` entry) sorted by key and joined by commas,
with every character outside `A-Za-z0-9._=,+-` replaced by '-' (so `model.variant=S/16` becomes
`model.variant=S-16`). Fixed overrides are not part of the name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import re
from pathlib import Path
from typing import Any, Mapping

from vit_jax.train.config import split_config_arg

# Where relative base-config paths are looked up after the current directory: the checkout holding this package.
REPO_ROOT = Path(__file__).resolve().parents[2]

_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")
_MAX_NAME = 180  # well below the 255-byte file-name limit, leaving room for suffixes such as '.orbax-checkpoint-tmp'
_SWEEP_KEYS = {"base", "fixed", "grid", "runs", "description"}


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a sweep: its name, the overrides that define it, and the fixed ones added to them."""

    name: str
    overrides: dict[str, Any]  # the run's own overrides (those that name it)
    fixed: dict[str, Any]  # applied to every run of the sweep

    @property
    def all_overrides(self) -> dict[str, Any]:
        # The run's own values win over the sweep-wide ones, so a single run can deviate from `fixed`.
        return {**self.fixed, **self.overrides}

    def config(self, base: str) -> str:
        """This run's config file with its arguments: the base's, updated by the run's `config_args`."""
        config_args = split_config_args(self.all_overrides)[0]
        if not config_args:
            return base  # the base's argument, whatever its syntax, as given
        path, base_arg = split_arg(base)
        merged = {**split_config_arg(base_arg, _NEEDS_PAIRS), **config_args}
        return f"{path}:{','.join(f'{k}={v}' for k, v in merged.items())}"

    @property
    def config_overrides(self) -> dict[str, Any]:
        """The config-key overrides (`--config.KEY=VALUE`), without the config file's arguments."""
        return split_config_args(self.all_overrides)[1]

    def trainer_args(self, base: str, workdir: str) -> list[str]:
        """The arguments of `python -m vit_jax.main` for this run."""
        args = [f"--config={self.config(base)}", f"--workdir={workdir}"]
        args += [f"--config.{key}={format_value(value)}" for key, value in self.config_overrides.items()]
        return args


@dataclasses.dataclass(frozen=True)
class Sweep:
    """An expanded sweep: the base config (path[:args]) and the runs in definition order."""

    source: str
    base: str
    runs: tuple[Run, ...]
    description: str = ""

    def select(self, patterns: list[str] | None) -> list[Run]:
        """Runs whose names match any of the glob patterns (all runs when there are none)."""
        if not patterns:
            return list(self.runs)
        import fnmatch

        chosen = [r for r in self.runs if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]
        if not chosen:
            raise ValueError(f"no run of {self.source} matches {patterns}; `vit-jax sweep run --dry-run` lists them")
        return chosen


CONFIG_ARGS = "config_args"  # the reserved override key (see the module docstring)
_NEEDS_PAIRS = "; `config_args` needs a base config whose argument is name=value pairs"


def split_config_args(overrides: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """Separates the base config's arguments (`config_args`, `config_args.NAME`) from the config-key overrides."""
    config_args: dict[str, str] = {}
    rest: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == CONFIG_ARGS:
            config_args.update(split_config_arg(str(value), _NEEDS_PAIRS))
        elif key.startswith(CONFIG_ARGS + "."):
            config_args[key[len(CONFIG_ARGS) + 1:]] = value if isinstance(value, str) else format_value(value)
        else:
            rest[key] = value
    return config_args, rest


def format_value(value: Any) -> str:
    """A config value as the command line spells it (`--config.key=VALUE`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # shortest exact form: 0.001, 1e-05
    if isinstance(value, (list, tuple)):
        # ml_collections parses tuple overrides with ast.literal_eval: strings inside must be quoted.
        items = [repr(v) if isinstance(v, str) else format_value(v) for v in value]
        return "(" + ",".join(items) + ("," if len(items) == 1 else "") + ")"
    if value is None:
        return "None"
    return str(value)


def name_value(value: Any) -> str:
    """A config value as it appears in a run name: like the command line, sequences joined by '-'."""
    if isinstance(value, (list, tuple)):
        return "-".join(name_value(v) for v in value)
    return format_value(value)


def safe_name(text: str) -> str:
    """A file-system and shell safe version of `text` (characters outside A-Za-z0-9._=,+- become '-')."""
    name = _UNSAFE.sub("-", text).strip(".")  # no hidden or '..' names
    if len(name) > _MAX_NAME:
        # Keep it readable and still unique: a prefix plus a hash of the whole.
        digest = hashlib.sha1(text.encode()).hexdigest()[:10]
        name = f"{name[:_MAX_NAME - 11]}~{digest}"
    return name or "base"


def run_name(parts: list[tuple[str, str]]) -> str:
    """The run name of (sort key, text) parts: sorted, joined by commas, made file-system safe."""
    return safe_name(",".join(text for _, text in sorted(parts))) if parts else "base"


def flatten(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optimizer": {"lr": 1}} -> {"optimizer.lr": 1}; dotted keys pass through."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, full + "."))
        else:
            out[full] = value
    return out


def _as_dict(obj: Any) -> Any:
    return obj.to_dict() if hasattr(obj, "to_dict") else obj


def _choices(axis: str, values: Any) -> list[tuple[dict[str, Any], tuple[str, str]]]:
    """One grid axis -> [(overrides, name part)]."""
    values = _as_dict(values)
    if isinstance(values, Mapping):  # named group: {label: {key: value, ...}}
        out = []
        for label, group in values.items():
            if not isinstance(_as_dict(group), Mapping):
                raise ValueError(f"grid axis {axis!r}: a labelled value must be a dict of overrides, got {group!r}")
            out.append((flatten(_as_dict(group)), (axis, f"{axis}={label}")))
        return out
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"grid axis {axis!r} must be a list of values (or a {{label: overrides}} dict), "
                         f"got {values!r}")
    return [({axis: v}, (axis, f"{axis}={name_value(v)}")) for v in values]


def _entries(runs: Any) -> list[tuple[dict[str, Any], list[tuple[str, str]]]]:
    """The `runs` entry -> [(overrides, name parts)]."""
    runs = _as_dict(runs)
    if runs is None:
        return [({}, [])]
    if isinstance(runs, Mapping):
        # "" sorts first: the label leads the name.
        return [(flatten(_as_dict(o)), [("", str(label))]) for label, o in runs.items()]
    out = []
    for overrides in runs:
        flat = flatten(_as_dict(overrides))
        out.append((flat, [(k, f"{k}={name_value(v)}") for k, v in flat.items()]))
    return out


def expand(definition: Mapping[str, Any], source: str = "<sweep>") -> Sweep:
    """Expands a sweep definition (see the module docstring) into its named runs."""
    definition = _as_dict(definition)
    unknown = set(definition) - _SWEEP_KEYS
    if unknown:
        raise ValueError(f"{source}: unknown sweep entries {sorted(unknown)}; allowed: {sorted(_SWEEP_KEYS)}")
    if not definition.get("base"):
        raise ValueError(f"{source}: the sweep needs a 'base' training config, e.g. base='configs/demo.py'")
    fixed = flatten(_as_dict(definition.get("fixed") or {}))
    grid = _as_dict(definition.get("grid") or {})
    axes = [_choices(axis, values) for axis, values in grid.items()]

    runs: list[Run] = []
    seen: dict[str, dict[str, Any]] = {}
    for entry, entry_parts in _entries(definition.get("runs")):
        for point in itertools.product(*axes):
            overrides, parts = dict(entry), list(entry_parts)
            for group, part in point:
                clash = set(group) & set(overrides)
                if clash:
                    raise ValueError(f"{source}: keys {sorted(clash)} are set by both the runs list and the grid; "
                                     "set each key in one place")
                overrides.update(group)
                parts.append(part)
            name = run_name(parts)
            if name in seen:
                if seen[name] == overrides:
                    continue  # the same run listed twice: run it once
                raise ValueError(f"{source}: runs {seen[name]} and {overrides} both get the name {name!r}; "
                                 "give them labels ({label: overrides}) that differ")
            seen[name] = overrides
            runs.append(Run(name=name, overrides=overrides, fixed=fixed))
    return Sweep(source=source, base=str(definition["base"]), runs=tuple(runs),
                 description=str(definition.get("description", "")))


def split_arg(spec: str) -> tuple[str, str | None]:
    """"path.py:ARG" -> ("path.py", "ARG"); "path.py" -> ("path.py", None)."""
    m = re.match(r"^(.*?\.py)(?::(.*))?$", spec)
    if not m:
        raise ValueError(f"{spec!r} is not a Python config file; expected PATH.py or PATH.py:ARG")
    return m[1], m[2]


def resolve_config_path(path: str, *, also_under: tuple[Path, ...] = ()) -> str:
    """A config path that works from the current directory: as given if it exists here, else found under the
    repository root (or `also_under`) and made absolute."""
    if Path(path).is_file():
        return path
    for root in (REPO_ROOT, *also_under):
        if (root / path).is_file():
            return str(root / path)
    raise FileNotFoundError(f"config file {path!r} not found (looked in the current directory and {REPO_ROOT}); "
                            "pass a path relative to the repository root or an absolute one")


def load_sweep(spec: str) -> Sweep:
    """Loads `FILE.py[:ARG]`: calls its get_sweep() (with ARG when given) and expands the result."""
    path, arg = split_arg(spec)
    path = resolve_config_path(path)
    module_spec = importlib.util.spec_from_file_location(f"_vit_jax_sweep_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, "get_sweep"):
        raise ValueError(f"{path} defines no get_sweep(); a sweep file returns its definition from get_sweep()")
    definition = module.get_sweep(arg) if arg is not None else module.get_sweep()
    sweep = expand(definition, source=spec)
    base_path, base_arg = split_arg(sweep.base)
    base_path = resolve_config_path(base_path, also_under=(Path(path).resolve().parent,))
    base = base_path if base_arg is None else f"{base_path}:{base_arg}"
    return dataclasses.replace(sweep, base=base)
