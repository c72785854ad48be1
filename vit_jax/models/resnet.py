"""BiT ResNet stem of the hybrid ViTs (R50+ViT-B/16, R26+ViT-S/32, ...): weight-standardised convolutions + GroupNorm.

Parameter names follow the official hybrid checkpoints (`conv_root`, `gn_root`, `block{s}/unit{u}/conv{1,2,3}`,
`gn{1,2,3}`, `conv_proj`, `gn_proj`), so loading is a rename of the prefix only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax.models.layers import lecun_normal, ones, param, zeros

WS_EPS = 1e-5  # weight standardisation: (w - mean) / (std + eps), as in the official code
GN_EPS = 1e-6
GN_GROUPS = 32


def symmetric_padding(kernel: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """BiT's "fixed" padding: (k - 1) // 2 on every side whatever the stride (TF's SAME pads less on top/left)."""
    p = (kernel - 1) // 2
    return ((p, p), (p, p))


class StdConv(nnx.Module):
    """Bias-free convolution with weight standardisation over (kh, kw, in) per output channel.

    The hybrid stem (official ViT code): SAME padding, (w - mean) / (std + 1e-5). BiT ResNet-v2 passes
    `padding=symmetric_padding(k)` and `ws_eps_in_variance` (w - mean) / sqrt(var + eps), as big_transfer and timm.
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, *, padding="SAME", ws_eps: float = WS_EPS,
                 ws_eps_in_variance: bool = False, param_dtype, rngs):
        self.stride = stride
        self.padding = padding
        self.ws_eps = ws_eps
        self.ws_eps_in_variance = ws_eps_in_variance
        self.kernel = param(rngs, lecun_normal(3), (kernel, kernel, cin, cout), param_dtype,
                            (None, None, "conv_in", "conv_out"))

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.kernel[...].astype(jnp.float32)
        w = w - w.mean(axis=(0, 1, 2))
        if self.ws_eps_in_variance:
            w = w * jax.lax.rsqrt(jnp.square(w).mean(axis=(0, 1, 2)) + self.ws_eps)
        else:
            w = w / (w.std(axis=(0, 1, 2)) + self.ws_eps)
        return jax.lax.conv_general_dilated(x, w.astype(x.dtype), (self.stride, self.stride), self.padding,
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))


class GroupNorm(nnx.Module):
    def __init__(self, channels: int, *, zero_scale: bool = False, eps: float = GN_EPS, param_dtype, rngs):
        self.eps = eps
        self.scale = param(rngs, zeros if zero_scale else ones, (channels,), param_dtype, ("norm",))
        self.bias = param(rngs, zeros, (channels,), param_dtype, ("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        n, h, w, c = x.shape
        xg = x.astype(jnp.float32).reshape(n, h, w, GN_GROUPS, c // GN_GROUPS)
        mean = xg.mean(axis=(1, 2, 4), keepdims=True)
        var = jnp.square(xg - mean).mean(axis=(1, 2, 4), keepdims=True)
        y = ((xg - mean) * jax.lax.rsqrt(var + self.eps)).reshape(n, h, w, c)
        return (y * self.scale[...] + self.bias[...]).astype(x.dtype)


class BottleneckUnit(nnx.Module):
    """1x1 -> 3x3 (strided) -> 1x1 bottleneck with a projection shortcut when the shape changes."""

    def __init__(self, cin: int, features: int, stride: int, *, param_dtype, rngs):
        kw = dict(param_dtype=param_dtype, rngs=rngs)
        cout = features * 4
        if cin != cout or stride != 1:
            self.conv_proj = StdConv(cin, cout, 1, stride, **kw)
            self.gn_proj = GroupNorm(cout, **kw)
        else:
            self.conv_proj = None
        self.conv1 = StdConv(cin, features, 1, **kw)
        self.gn1 = GroupNorm(features, **kw)
        self.conv2 = StdConv(features, features, 3, stride, **kw)
        self.gn2 = GroupNorm(features, **kw)
        self.conv3 = StdConv(features, cout, 1, **kw)
        self.gn3 = GroupNorm(cout, zero_scale=True, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        residual = self.gn_proj(self.conv_proj(x)) if self.conv_proj is not None else x
        y = jax.nn.relu(self.gn1(self.conv1(x)))
        y = jax.nn.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return jax.nn.relu(residual + y)


class ResNetStem(nnx.Module):
    """Root (7x7/2 conv, GroupNorm, ReLU, 3x3/2 max-pool) and stages `block1..blockN` of bottleneck units."""

    def __init__(self, layers: tuple[int, ...], width_factor: int, *, param_dtype, rngs):
        kw = dict(param_dtype=param_dtype, rngs=rngs)
        width = 64 * width_factor
        self.conv_root = StdConv(3, width, 7, 2, **kw)
        self.gn_root = GroupNorm(width, **kw)
        self.num_stages = len([u for u in layers if u])  # (0,): the root alone
        cin = width
        for s, units in enumerate(layers[: self.num_stages], 1):
            features = width * 2 ** (s - 1)
            stage = nnx.Dict()
            for u in range(1, units + 1):
                stride = 2 if (u == 1 and s > 1) else 1
                stage[f"unit{u}"] = BottleneckUnit(cin, features, stride, **kw)
                cin = features * 4
            setattr(self, f"block{s}", stage)
        self.out_channels = cin

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.gn_root(self.conv_root(x)))
        x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
        for s in range(1, self.num_stages + 1):
            stage = getattr(self, f"block{s}")
            for u in range(1, len(stage) + 1):
                x = stage[f"unit{u}"](x)
        return x


def resnet_out_channels(layers: tuple[int, ...], width_factor: int) -> int:
    if not any(layers):  # root only: the root conv's channels
        return 64 * width_factor
    return 64 * width_factor * 2 ** (len(layers) - 1) * 4
