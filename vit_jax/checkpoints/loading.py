"""One entry point for every checkpoint a user may hold: `load_any(path) -> (model config, params)`.

The config belongs to some model family (models/family.py); `vit_jax.models.build.build_model(cfg)` builds it. Files
are read by the format readers the families register (checkpoints/formats.py); the built-in ones are imported here.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# siglip_formats before vit_formats: its reader of two-tower .npz files is asked before the ViT's (registry order).
from vit_jax.checkpoints import bit, formats, siglip_formats, swin_formats, video_formats, vit_formats  # noqa: F401
from vit_jax.checkpoints.layouts import CheckpointReadError, ImageSizeRequiredError
from vit_jax.errors import one_line
from vit_jax.storage.remote import is_url


def load_any(path: str, **infer_kw: Any) -> tuple[Any, dict[str, Any]]:
    """Loads parameters (numpy, our nested layout) and the architecture from any supported checkpoint.

    - `.npz`: official ViT / AugReg or big_vision layout (architecture inferred from the arrays; `infer_kw` go to
      `infer_config`, e.g. `fallback_image_size` for a file that does not record its resolution), or a big_transfer
      BiT ResNet-v2 (`resnet/root_block/...` keys);
    - `.safetensors`: a timm ViT state dict (as written by `vit-jax convert --to timm`) or a timm `resnetv2_*_bit`
      one (`stem.conv.weight`);
    - a directory: one of our training runs (workdir), its `checkpoints/` folder, or a single step folder.
    Our run directories and timm exports record their resolution, so `fallback_image_size` is not used there.
    """
    path = os.fspath(path)
    check_exists(path)
    remote = is_url(path)
    if path.endswith(formats.suffixes()):
        from safetensors import SafetensorError

        try:
            reader = formats.reader_for(path)
            if reader is None:
                raise formats.UnrecognisedCheckpointError(formats.describe_unrecognised(path))
            return reader.load(path, **infer_kw)
        except SafetensorError as e:
            raise CheckpointReadError(f"{path} is not a readable .safetensors file ({one_line(e)})") from e
    if os.path.isdir(path) or remote:
        from vit_jax.checkpoints.training import load_params_from_run

        return load_params_from_run(path)
    raise formats.UnrecognisedCheckpointError(formats.describe_unknown_file(path))


def check_exists(path: str) -> None:
    """A missing checkpoint is a one-line error before anything else is done (data, compilation)."""
    from etils import epath

    if not epath.Path(path).exists():
        raise CheckpointReadError(f"checkpoint {path} does not exist (give an official .npz, a timm .safetensors, "
                                  "or a training run directory)")


def parse_size(text: str) -> tuple[int, int]:
    """`384` or `384x512` (height x width) -> (h, w)."""
    h, _, w = text.lower().partition("x")
    return int(h), int(w or h)


def load_with_size(path: str, image_size: tuple[int, int] | None, flag: str, *, must_match: bool = True):
    """load_any, with `image_size` used where the checkpoint does not record its resolution.

    Returns (cfg, params), or None after printing a one-line error naming `flag`: the size is needed and missing, or
    (with `must_match`, for a size the user typed) it contradicts the resolution the checkpoint records."""
    try:
        cfg, params = load_any(path, fallback_image_size=image_size)
    except ImageSizeRequiredError as e:
        print(f"error: {path}: {e.reason}; pass {flag} (e.g. 224 or 384x512)", file=sys.stderr)
        return None
    if must_match and image_size and tuple(cfg.image_size) != tuple(image_size):
        print(f"error: {path} records image size {cfg.image_size[0]}x{cfg.image_size[1]}, not {flag} "
              f"{image_size[0]}x{image_size[1]}; {flag} is only for checkpoints that do not record it", file=sys.stderr)
        return None
    return cfg, params
