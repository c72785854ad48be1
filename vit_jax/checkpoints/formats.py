"""The checkpoint side of the model-family seam: each family registers, in its own checkpoint module, how its files
are recognised and read (`Reader`) and what `vit-jax convert` can write for it (`Exporter`).

Built in (imported by checkpoints/loading.py): the ViT family's official/big_vision .npz and timm .safetensors
(checkpoints/vit_formats.py), BiT's big_transfer .npz and timm `resnetv2_*_bit` .safetensors (checkpoints/bit.py).
Our own run directories are every family's: their metadata names the family (models/family.py `from_meta`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from vit_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Reader:
    family: str
    suffix: str  # ".npz", ".safetensors"
    # path -> whether this reader reads the file (cheap: names or a header, never the arrays); None: the suffix's
    # reader of last resort, asked after every other reader of the suffix declined.
    recognise: Callable[[str], bool] | None
    load: Callable[..., tuple[Any, dict[str, Any]]]  # (path, **infer_kw) -> (model config, params)
    # For the one line about a file no reader recognises (`describe_unrecognised`): what this reader reads, in a few
    # words, and a few array names its files always hold (which family a foreign file is nearest to).
    reads: str = ""
    signature: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ExportRequest:
    """What `vit-jax convert` asks of an exporter: the target layout and the optional surgery."""
    to: str
    image_size: tuple[int, int] | None = None
    num_classes: int | None = None
    drop_pre_logits: bool = False
    posemb_method: str = "bicubic"


@dataclasses.dataclass(frozen=True)
class Exporter:
    family: str
    targets: tuple[str, ...]  # the --to values it writes
    # (config, params, destination, request) -> (the written model's config, notes on the surgery, layout name);
    # raises ExportError (one line) for what the family cannot express.
    export: Callable[[Any, dict[str, Any], str, ExportRequest], tuple[Any, list[str], str]]


@dataclasses.dataclass(frozen=True)
class Converter:
    """Initialising a model of family `target` from a checkpoint of family `source` (a video ViT from an image ViT:
    checkpoints/video_formats.py): `convert(loaded config, loaded params, target config, target's fresh init)` ->
    (params in the target's layout and sizes, notes). Fine-tune surgery (checkpoints/surgery.py adapt_params) runs
    it when the two families differ, then treats the result as a checkpoint of the target's family."""
    source: str
    target: str
    convert: Callable[[Any, dict[str, Any], Any, dict[str, Any]], tuple[dict[str, Any], list[str]]]


CONVERTERS: dict[tuple[str, str], Converter] = {}


def register_converter(converter: Converter) -> Converter:
    CONVERTERS[(converter.source, converter.target)] = converter
    return converter


class ExportError(UserError, ValueError):
    """A conversion the checkpoint's family cannot express (a layout, a layer it does not have)."""


READERS: list[Reader] = []
EXPORTERS: dict[str, Exporter] = {}


def register_reader(reader: Reader) -> Reader:
    READERS.append(reader)
    return reader


def register_exporter(exporter: Exporter) -> Exporter:
    assert exporter.family not in EXPORTERS, f"exporter of {exporter.family} registered twice"
    EXPORTERS[exporter.family] = exporter
    return exporter


def suffixes() -> tuple[str, ...]:
    return tuple(dict.fromkeys(r.suffix for r in READERS))


def reader_for(path: str) -> Reader | None:
    """The reader of a file: the first of its suffix's readers that recognises it, else the suffix's last resort
    (None when there is none: `describe_unrecognised` says what the file is)."""
    candidates = [r for r in READERS if path.endswith(r.suffix)]
    for reader in candidates:
        if reader.recognise is not None and reader.recognise(path):
            return reader
    return next((r for r in candidates if r.recognise is None), None)


class UnrecognisedCheckpointError(UserError, ValueError):
    """A checkpoint file no registered reader recognises (a family vit_jax does not know, or not a checkpoint)."""


# Files of frameworks whose checkpoints are pickles, which vit_jax never loads (unpickling can run code).
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")


def array_names(path: str) -> tuple[str, list[str]]:
    """(the file's layout in words, the names of the arrays it holds), from its header or index where it has one.

    Raises the readers' own one-line errors for a file that cannot be read at all (a truncated or pickled .npz)."""
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, "np") as f:
            return "safetensors state dict", list(f.keys())
    if path.endswith(".npz"):
        from vit_jax.checkpoints.layouts import load_npz

        return ".npz archive", list(load_npz(path))  # its errors name a truncated or pickled file
    raise ValueError(f"no array index for {path}")


def _tokens(names: list[str] | tuple[str, ...]) -> set[str]:
    """The first component of each array name: a family's vocabulary of top-level modules."""
    return {n.replace("/", ".").split(".")[0] for n in names}


def _telling(names: list[str], count: int = 4) -> list[str]:
    """A few names that show a file's structure: the first one of each top-level module."""
    firsts: dict[str, str] = {}
    for name in names:
        firsts.setdefault(name.replace("/", ".").split(".")[0], name)
    return list(firsts.values())[:count]


def readable() -> str:
    """What vit-jax reads, in words: every registered reader's `reads`, and our run directories."""
    by_family: dict[str, list[str]] = {}
    for r in READERS:
        by_family.setdefault(r.family, []).append(r.reads or r.suffix)
    return ", ".join(f"{family} ({', '.join(dict.fromkeys(kinds))})" for family, kinds in sorted(by_family.items())) + (
        ", and vit-jax run directories (any family)")


def describe_unrecognised(path: str) -> str:
    """One line for a file no reader recognises: its layout, a few telling array names, the nearest known family
    (most top-level modules in common with a reader's signature, among readers of its suffix) and what vit-jax
    reads."""
    layout, names = array_names(path)
    found = f"{path}: a {layout} of {len(names)} arrays (" + ", ".join(_telling(names)) + ", ...)"
    ours = _tokens(names)
    scored = sorted(((len(ours & _tokens(r.signature)) / len(ours | _tokens(r.signature)), r.family)
                     for r in READERS if path.endswith(r.suffix) and r.signature), reverse=True)
    near = ""
    if scored and scored[0][0] > 0:
        reader = next(r for r in READERS if r.family == scored[0][1] and path.endswith(r.suffix))
        missing = [k for k in reader.signature if k not in names][:2]
        near = f"; nearest known family: {reader.family} ({reader.reads}), whose files hold {', '.join(missing)}"
    return f"{found} that no reader recognises{near}. vit-jax reads: {readable()}"


def describe_unknown_file(path: str) -> str:
    """One line for a file whose suffix no reader reads (a torch pickle, some other format)."""
    if path.endswith(PICKLE_SUFFIXES):
        return (f"{path}: a pickled (torch) checkpoint, which vit-jax never loads (unpickling can run code); save its "
                "state dict with safetensors.torch.save_file. vit-jax reads: " + readable())
    return f"{path}: not a checkpoint vit-jax reads. vit-jax reads: {readable()}"


def targets() -> tuple[str, ...]:
    """Every --to value some family's exporter writes."""
    return tuple(dict.fromkeys(t for e in EXPORTERS.values() for t in e.targets))


def exporter_for(family: str) -> Exporter:
    try:
        return EXPORTERS[family]
    except KeyError:
        raise ExportError(f"model family {family} has no checkpoint exporter registered") from None
