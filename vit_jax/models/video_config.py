"""Video ViT configuration (ViViT, Arnab et al. 2021): one frozen dataclass and names such as "ViViT-B/16x2".

A clip (T, H, W, 3) is cut into tubelets of t frames x p x p pixels (a 3D convolution with stride = kernel), each
linearly embedded. Two encoders (the paper's §3.3):
- `joint` (Model 1, "spatio-temporal attention"): one Transformer over all nt*gh*gw tokens and a class token, with a
  learned space-time position embedding (one row per token);
- `factorised` (Model 2, "factorised encoder"): a spatial Transformer on each time step's gh*gw tokens and its class
  token, then a temporal Transformer over the nt per-step class tokens and a temporal class token.
The transformer sizes follow the ViT's (Ti/S/B/L/H, models/config.py SIZES). The paper's Kinetics models are
ViViT-B/16x2 at 32 frames of 224 px; its factorised encoder has 4 temporal layers (scenic's
vivit_base_factorised_encoder config: temporal_transformer.num_layers=4).

Pure Python (no JAX): the family module and checkpoint readers import it cheaply.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from vit_jax.models.config import DTYPES, GELUS, REMAT_POLICIES, SIZES, ModelConfigError, ViTConfig, _pair

ENCODERS = ("joint", "factorised")
POOLS = ("token", "gap")
DEFAULT_TEMPORAL_DEPTH = 4  # ViViT-FE-B's temporal Transformer (scenic's Kinetics config)


@dataclasses.dataclass(frozen=True)
class VideoConfig:
    """Everything that defines a video ViT's parameters and computation (shapes depend on the clip size)."""

    num_classes: int = 400  # 0: no head; the model returns the pooled features
    num_frames: int = 32  # frames per clip the model is built for (the position embeddings have one row per step)
    image_size: tuple[int, int] = (224, 224)
    patch_size: tuple[int, int] = (16, 16)
    tubelet: int = 2  # frames per tubelet (the 3D kernel's temporal extent and stride)
    width: int = 768
    depth: int = 12  # (spatial) Transformer blocks
    mlp_dim: int = 3072
    num_heads: int = 12
    encoder: str = "joint"  # joint | factorised
    temporal_depth: int = 0  # factorised: blocks of the temporal Transformer (0: DEFAULT_TEMPORAL_DEPTH)
    pool: str = "token"  # token | gap (over every token; factorised: over the per-step features)
    head_bias_init: float = 0.0
    drop_path: float = 0.0
    gelu: str = "tanh"  # the official ViT and transformers' ViViT ("gelu_fast") use the tanh approximation
    ln_eps: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"
    dense: ClassVar[bool] = False  # read as a classifier (fine-tune surgery and the commands ask)

    def __post_init__(self):
        for name, allowed in (("encoder", ENCODERS), ("pool", POOLS), ("gelu", GELUS), ("remat", REMAT_POLICIES),
                              ("dtype", DTYPES), ("param_dtype", DTYPES)):
            if getattr(self, name) not in allowed:
                raise ModelConfigError(f"VideoConfig.{name}={getattr(self, name)!r} is not one of {allowed}")
        if min(self.width, self.depth, self.mlp_dim, self.num_heads, self.tubelet, self.num_frames) < 1:
            raise ModelConfigError("VideoConfig: width, depth, mlp_dim, num_heads, tubelet and num_frames must be "
                                   "positive")
        if self.width % self.num_heads:
            raise ModelConfigError(f"VideoConfig: width {self.width} is not divisible by num_heads {self.num_heads}")
        if self.num_frames % self.tubelet:
            raise ModelConfigError(f"VideoConfig.num_frames={self.num_frames} is not a multiple of the tubelet's "
                                   f"{self.tubelet} frames")
        if self.image_size[0] % self.patch_size[0] or self.image_size[1] % self.patch_size[1]:
            raise ModelConfigError(f"VideoConfig.image_size={self.image_size} is not divisible by patch_size "
                                   f"{self.patch_size}")
        if self.temporal_depth < 0 or (self.temporal_depth and self.encoder == "joint"):
            raise ModelConfigError(f"VideoConfig.temporal_depth={self.temporal_depth}: only the factorised encoder "
                                   "has a temporal Transformer (0 = its default of 4 blocks)")
        if self.num_classes < 0 or not 0.0 <= self.drop_path < 1.0:
            raise ModelConfigError(f"VideoConfig: num_classes={self.num_classes} must be >= 0 and "
                                   f"drop_path={self.drop_path} in [0, 1)")

    @property
    def grid(self) -> tuple[int, int, int]:
        """(time steps, rows, columns) of tubelets."""
        return (self.num_frames // self.tubelet, self.image_size[0] // self.patch_size[0],
                self.image_size[1] // self.patch_size[1])

    @property
    def num_tubelets(self) -> int:
        nt, gh, gw = self.grid
        return nt * gh * gw

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        """One example's clip: (frames, height, width, channels), the `image` field of a video batch."""
        return (self.num_frames, *self.image_size, 3)

    @property
    def num_temporal_blocks(self) -> int:
        return (self.temporal_depth or DEFAULT_TEMPORAL_DEPTH) if self.encoder == "factorised" else 0

    def encoder_config(self, depth: int) -> ViTConfig:
        """The ViTConfig whose encoder (models/vit.py Encoder: the same blocks and parameter layout as an image ViT,
        which is what lets an image checkpoint inflate) runs `depth` blocks of this model's size."""
        return ViTConfig(num_classes=0, image_size=self.patch_size, patch_size=self.patch_size, width=self.width,
                         depth=depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, pool=self.pool,
                         gelu=self.gelu, drop_path=self.drop_path, dtype=self.dtype, param_dtype=self.param_dtype,
                         remat=self.remat, ln_eps=self.ln_eps)

    @property
    def name(self) -> str:
        size = next((k for k, v in SIZES.items() if v == dict(width=self.width, depth=self.depth,
                                                              mlp_dim=self.mlp_dim, num_heads=self.num_heads)), None)
        size = size or f"w{self.width}d{self.depth}m{self.mlp_dim}h{self.num_heads}"
        p = self.patch_size
        patch = str(p[0]) if p[0] == p[1] else f"{p[0]}x{p[1]}"
        fe = "FE-" if self.encoder == "factorised" else ""
        return f"ViViT-{fe}{size}/{patch}x{self.tubelet}"

    def replace(self, **kw: Any) -> "VideoConfig":
        return dataclasses.replace(self, **_normalise(kw))


def _normalise(kw: dict[str, Any]) -> dict[str, Any]:
    kw = dict(kw)
    for key in ("image_size", "patch_size"):
        if key in kw:
            kw[key] = _pair(kw[key])
    if "num_classes" in kw and kw["num_classes"] is None:
        kw["num_classes"] = 0
    return kw


# "ViViT-B/16x2" (joint), "ViViT-FE-B/16x2" (factorised encoder): size, patch, tubelet frames.
_NAME_RE = re.compile(r"^ViViT-(?P<fe>FE-)?(?P<size>Ti|S|M|B|L|H|g|G)/(?P<patch>\d+)x(?P<tubelet>\d+)$")


def is_video_name(name: str) -> bool:
    return bool(_NAME_RE.match(name.strip()))


def parse_video_name(name: str) -> dict[str, Any]:
    """"ViViT-FE-B/16x2" -> the B sizes, 16x16 patches, 2-frame tubelets, the factorised encoder."""
    m = _NAME_RE.match(name.strip())
    if not m:
        raise ModelConfigError(f"unknown video model {name!r}: expected ViViT-<size>/<patch>x<frames> (joint) or "
                               f"ViViT-FE-<size>/<patch>x<frames> (factorised), sizes {', '.join(SIZES)}")
    return dict(SIZES[m["size"]], patch_size=int(m["patch"]), tubelet=int(m["tubelet"]),
                encoder="factorised" if m["fe"] else "joint")


def video_config(name: str | None = None, **overrides: Any) -> VideoConfig:
    """A VideoConfig from a name ("ViViT-B/16x2") plus keyword overrides (num_frames=8, width=64, ...)."""
    kw = parse_video_name(name) if name else {}
    kw.update(overrides)
    return VideoConfig(**_normalise(kw))
