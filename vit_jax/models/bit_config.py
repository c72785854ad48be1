"""BiT ResNet-v2 configuration: one frozen dataclass, and names such as "BiT-R50x1", "R152x2" or "R200x3".

BiT (Kolesnikov et al., 2020) is the ViT paper's ResNet baseline (§4.4, Table 6, Figure 5): a pre-activation ResNet-v2
with GroupNorm and weight-standardised convolutions. Its parameters do not depend on the resolution; `image_size` is the
resolution it is evaluated at (FLOPs, preprocessing, the size `vit-jax predict` checks images against).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from vit_jax.models.config import DTYPES, REMAT_POLICIES, ModelConfigError, _pair

# Units per stage by depth (BiT paper Table 1 / big_transfer, timm's resnetv2_*_bit): depth = 3 * units + 2.
BIT_DEPTHS: dict[int, tuple[int, ...]] = {
    26: (2, 2, 2, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
    200: (3, 24, 36, 3),
}
# big_transfer's numerics; timm's resnetv2_*_bit use GroupNorm eps 1e-5 and weight-standardisation eps 1e-8.
BIT_GN_EPS = 1e-6
BIT_WS_EPS = 1e-10
TIMM_GN_EPS = 1e-5
TIMM_WS_EPS = 1e-8


@dataclasses.dataclass(frozen=True)
class BiTConfig:
    """Everything that defines a BiT ResNet-v2's parameters and computation."""

    layers: tuple[int, ...] = (3, 4, 6, 3)  # bottleneck units per stage (mid-channels 64 * width_factor * 2**s)
    width_factor: int = 1
    dense: ClassVar[bool] = False  # no dense-output option (ViTConfig.dense): a BiT is always read as a classifier
    num_classes: int = 1000  # 0: no head; the model returns the pooled features
    head_bias_init: float = 0.0  # as ViTConfig's: -10 for sigmoid cross-entropy pretraining (e.g. ImageNet-21k)
    image_size: tuple[int, int] = (224, 224)  # does not change the parameters
    gn_eps: float = BIT_GN_EPS
    ws_eps: float = BIT_WS_EPS  # weight standardisation (w - mean) / sqrt(var + ws_eps)
    dtype: str = "float32"  # compute dtype; parameters are always kept in param_dtype
    param_dtype: str = "float32"
    remat: str = "none"  # rematerialisation policy per bottleneck unit: none | full | dots | dots_no_batch

    def __post_init__(self):
        if not self.layers or any(u < 1 for u in self.layers):
            raise ModelConfigError(f"BiTConfig.layers={self.layers}: give one or more stages of at least one unit each")
        if self.width_factor < 1:
            raise ModelConfigError(f"BiTConfig.width_factor={self.width_factor} must be >= 1")
        if self.num_classes < 0:
            raise ModelConfigError(f"BiTConfig.num_classes={self.num_classes} must be >= 0 (0: no head)")
        if min(self.image_size) < 1:
            raise ModelConfigError(f"BiTConfig.image_size={self.image_size} must be positive")
        for name, allowed in (("remat", REMAT_POLICIES), ("dtype", DTYPES), ("param_dtype", DTYPES)):
            if getattr(self, name) not in allowed:
                raise ModelConfigError(f"BiTConfig.{name}={getattr(self, name)!r} is not one of {allowed}")
        if self.gn_eps <= 0 or self.ws_eps <= 0:
            raise ModelConfigError(f"BiTConfig gn_eps={self.gn_eps} and ws_eps={self.ws_eps} must be > 0")

    @property
    def width(self) -> int:
        """Channels of the root convolution (and the mid-channels of the first stage)."""
        return 64 * self.width_factor

    @property
    def out_channels(self) -> int:
        """Channels of the pooled features the head reads."""
        return self.width * 2 ** (len(self.layers) - 1) * 4

    @property
    def name(self) -> str:
        depth = next((d for d, layers in BIT_DEPTHS.items() if layers == self.layers), None)
        depth_name = str(depth) if depth else "-".join(map(str, self.layers))
        return f"BiT-R{depth_name}x{self.width_factor}"

    def replace(self, **kw: Any) -> "BiTConfig":
        return dataclasses.replace(self, **_normalise(kw))


def _normalise(kw: dict[str, Any]) -> dict[str, Any]:
    kw = dict(kw)
    if "image_size" in kw:
        kw["image_size"] = _pair(kw["image_size"])
    if "layers" in kw:
        kw["layers"] = tuple(int(u) for u in kw["layers"])
    if "num_classes" in kw and kw["num_classes"] is None:
        kw["num_classes"] = 0
    return kw


# "R50x1" (a depth of BIT_DEPTHS) or "R1-1x1" (units per stage spelled out: the name `BiTConfig.name` gives them).
_NAME_RE = re.compile(r"^(?:BiT-)?R(?P<depth>\d+(?:-\d+)*)x(?P<wf>\d+)$")


def is_bit_name(name: str) -> bool:
    """"BiT-R50x1" / "R152x2" (a ResNet) as opposed to a ViT variant such as "B/16" or "R50+B/16"."""
    return bool(_NAME_RE.match(name.strip()))


def parse_bit_name(name: str) -> dict[str, Any]:
    """"BiT-R50x1" or "R101x3" -> layers and width factor; "BiT-R1-1x1": one unit in each of two stages."""
    m = _NAME_RE.match(name.strip())
    if not m:
        raise ModelConfigError(f"unknown BiT model {name!r}: expected e.g. 'BiT-R50x1', 'R101x3', 'R152x2' (depths "
                               f"{', '.join(map(str, BIT_DEPTHS))}, any width factor)")
    if "-" in m["depth"]:
        return dict(layers=tuple(int(u) for u in m["depth"].split("-")), width_factor=int(m["wf"]))
    depth = int(m["depth"])
    if depth not in BIT_DEPTHS:
        raise ModelConfigError(
            f"{name}: no BiT ResNet of depth {depth}; known depths {', '.join(map(str, BIT_DEPTHS))}")
    return dict(layers=BIT_DEPTHS[depth], width_factor=int(m["wf"]))


def bit_config(name: str | None = None, **overrides: Any) -> BiTConfig:
    """Builds a BiTConfig from a name ("BiT-R50x1") plus keyword overrides (e.g. layers=(1, 1) for a tiny one)."""
    kw = parse_bit_name(name) if name else {}
    kw.update(overrides)
    return BiTConfig(**_normalise(kw))
