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
    """The reader of a file: the first of its suffix's readers that recognises it, else the suffix's last resort."""
    candidates = [r for r in READERS if path.endswith(r.suffix)]
    for reader in candidates:
        if reader.recognise is not None and reader.recognise(path):
            return reader
    return next((r for r in candidates if r.recognise is None), None)


def targets() -> tuple[str, ...]:
    """Every --to value some family's exporter writes."""
    return tuple(dict.fromkeys(t for e in EXPORTERS.values() for t in e.targets))


def exporter_for(family: str) -> Exporter:
    try:
        return EXPORTERS[family]
    except KeyError:
        raise ExportError(f"model family {family} has no checkpoint exporter registered") from None
