"""Swin Transformer configuration: one frozen dataclass, and names such as "Swin-T" or "Swin-64-2-2".

Swin (Liu et al., 2021) embeds 4x4 patches, then runs stages of blocks that attend inside local windows, every other
block with the windows shifted by half a window, and halves the resolution (doubling the channels) between stages by
merging 2x2 neighbouring patches. Sizes (the paper's Table 1 / §3.3; timm's `swin_*_patch4_window7_224`):
Swin-T C=96, depths 2-2-6-2; Swin-S C=96, 2-2-18-2; Swin-B C=128, 2-2-18-2; Swin-L C=192, 2-2-18-2; heads = C/32
doubling per stage (a head dimension of 32 everywhere); window 7 at 224 px and 12 at 384 px.

Pure Python (no JAX): the family module, the commands' choices and checkpoint readers import it cheaply.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from vit_jax.models.config import DTYPES, REMAT_POLICIES, ModelConfigError, _pair

HEAD_DIM = 32  # every named Swin uses 32 channels per head; custom names ("Swin-64-2-2") follow it
# name -> (embed dim, depths); heads follow HEAD_DIM.
SWIN_SIZES: dict[str, tuple[int, tuple[int, ...]]] = {
    "T": (96, (2, 2, 6, 2)),
    "S": (96, (2, 2, 18, 2)),
    "B": (128, (2, 2, 18, 2)),
    "L": (192, (2, 2, 18, 2)),
}
DEFAULT_WINDOW = 7


@dataclasses.dataclass(frozen=True)
class SwinConfig:
    """Everything that defines a Swin Transformer's parameters and computation."""

    embed_dim: int = 96  # channels of stage 1; stage s has embed_dim * 2**s
    depths: tuple[int, ...] = (2, 2, 6, 2)  # blocks per stage (pairs of window / shifted-window attention)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)  # attention heads per stage
    window_size: int = DEFAULT_WINDOW  # the attention window (tokens per side); clamped to a smaller stage
    patch_size: tuple[int, int] = (4, 4)  # (rows, columns) of pixels per patch, as ViTConfig's
    mlp_ratio: float = 4.0
    dense: ClassVar[bool] = False  # read as a classifier (its stage outputs are out["pyramid"])
    num_classes: int = 1000  # 0: no head; the model returns the pooled features
    head_bias_init: float = 0.0
    image_size: tuple[int, int] = (224, 224)  # must be divisible by patch_size * 2**(stages - 1)
    drop_path: float = 0.0  # stochastic depth, rising linearly over all blocks to this rate (timm, the paper)
    ln_eps: float = 1e-5  # PyTorch's LayerNorm default, which Swin's weights are trained with
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"  # rematerialisation policy per block: none | full | dots | dots_no_batch

    def __post_init__(self):
        if not self.depths or any(d < 1 for d in self.depths):
            raise ModelConfigError(f"SwinConfig.depths={self.depths}: give one or more stages of at least one block")
        if len(self.num_heads) != len(self.depths):
            raise ModelConfigError(f"SwinConfig.num_heads={self.num_heads} needs one entry per stage "
                                   f"(depths={self.depths})")
        for s, heads in enumerate(self.num_heads):
            if heads < 1 or self.stage_dim(s) % heads:
                raise ModelConfigError(f"SwinConfig: stage {s + 1} has {self.stage_dim(s)} channels, which "
                                       f"num_heads={heads} does not divide")
        if self.embed_dim < 1 or self.window_size < 1 or min(self.patch_size) < 1 or self.mlp_ratio <= 0:
            raise ModelConfigError(f"SwinConfig: embed_dim={self.embed_dim}, window_size={self.window_size}, "
                                   f"patch_size={self.patch_size} and mlp_ratio={self.mlp_ratio} must be positive")
        if self.num_classes < 0:
            raise ModelConfigError(f"SwinConfig.num_classes={self.num_classes} must be >= 0 (0: no head)")
        merges = 2 ** (len(self.depths) - 1)
        stride = (self.patch_size[0] * merges, self.patch_size[1] * merges)
        if min(self.image_size) < 1 or self.image_size[0] % stride[0] or self.image_size[1] % stride[1]:
            raise ModelConfigError(f"SwinConfig.image_size={self.image_size[0]}x{self.image_size[1]} must be a "
                                   f"positive multiple of {stride[0]}x{stride[1]} (the patch x 2**{len(self.depths) - 1}"
                                   " for the patch merges)")
        if not 0.0 <= self.drop_path < 1.0:
            raise ModelConfigError(f"SwinConfig.drop_path={self.drop_path} must be in [0, 1)")
        for name, allowed in (("remat", REMAT_POLICIES), ("dtype", DTYPES), ("param_dtype", DTYPES)):
            if getattr(self, name) not in allowed:
                raise ModelConfigError(f"SwinConfig.{name}={getattr(self, name)!r} is not one of {allowed}")

    def stage_dim(self, s: int) -> int:
        return self.embed_dim * 2 ** s

    def stage_grid(self, s: int) -> tuple[int, int]:
        """(rows, columns) of tokens in stage s."""
        f = 2 ** s
        return self.image_size[0] // (self.patch_size[0] * f), self.image_size[1] // (self.patch_size[1] * f)

    def stage_window(self, s: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(window, shift) of stage s's shifted blocks, per axis: a window larger than the stage is clamped to it and
        then not shifted (there is nothing to shift into), as the paper and timm do."""
        window, shift = [], []
        for r in self.stage_grid(s):
            window.append(min(r, self.window_size))
            shift.append(0 if r <= self.window_size else self.window_size // 2)
        return tuple(window), tuple(shift)

    @property
    def num_features(self) -> int:
        """Channels of the last stage (the pooled features the head reads)."""
        return self.stage_dim(len(self.depths) - 1)

    @property
    def name(self) -> str:
        for letter, (dim, depths) in SWIN_SIZES.items():
            if (dim, depths) == (self.embed_dim, self.depths) and self.num_heads == default_heads(dim, len(depths)):
                return f"Swin-{letter}"
        name = f"Swin-{self.embed_dim}-{'-'.join(map(str, self.depths))}"
        if self.num_heads != default_heads(self.embed_dim, len(self.depths)):
            name += f" (heads {'-'.join(map(str, self.num_heads))})"
        return name

    def replace(self, **kw: Any) -> "SwinConfig":
        return dataclasses.replace(self, **_normalise(kw))


def default_heads(embed_dim: int, stages: int) -> tuple[int, ...]:
    """Heads of HEAD_DIM channels in every stage (at least one)."""
    return tuple(max(1, embed_dim * 2 ** s // HEAD_DIM) for s in range(stages))


def _normalise(kw: dict[str, Any]) -> dict[str, Any]:
    kw = dict(kw)
    for key in ("image_size", "patch_size"):
        if key in kw:
            kw[key] = _pair(kw[key])
    for key in ("depths", "num_heads"):
        if key in kw:
            kw[key] = tuple(int(v) for v in kw[key])
    if "num_classes" in kw and kw["num_classes"] is None:
        kw["num_classes"] = 0
    return kw


# "Swin-T" (a named size), or "Swin-64-2-2" (embed dim, then the depth of each stage).
_NAME_RE = re.compile(r"^Swin-(?:(?P<letter>[TSBL])|(?P<dim>\d+)-(?P<depths>\d+(?:-\d+)*))$")


def is_swin_name(name: str) -> bool:
    return bool(_NAME_RE.match(name.strip()))


def parse_swin_name(name: str) -> dict[str, Any]:
    """"Swin-T" -> its embed dim, depths and heads; "Swin-64-2-2": embed 64, two stages of two blocks."""
    m = _NAME_RE.match(name.strip())
    if not m:
        raise ModelConfigError(f"unknown Swin model {name!r}: expected Swin-T, Swin-S, Swin-B, Swin-L, or "
                               "Swin-<embed dim>-<depth>-<depth>... (e.g. Swin-64-2-2)")
    if m["letter"]:
        dim, depths = SWIN_SIZES[m["letter"]]
    else:
        dim, depths = int(m["dim"]), tuple(int(d) for d in m["depths"].split("-"))
    return dict(embed_dim=dim, depths=depths, num_heads=default_heads(dim, len(depths)))


def swin_config(name: str | None = None, **overrides: Any) -> SwinConfig:
    """A SwinConfig from a name ("Swin-T") plus keyword overrides (window_size=12, image_size=384, ...)."""
    kw = parse_swin_name(name) if name else {}
    kw.update(overrides)
    return SwinConfig(**_normalise(kw))
