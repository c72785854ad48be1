"""BiT ResNet-v2 (Kolesnikov et al., 2020) in Flax NNX: the ViT paper's convolutional baseline.

Image -> root (7x7/2 weight-standardised conv, zero padding 1, 3x3/2 max-pool) -> stages of pre-activation bottleneck
units (GN -> ReLU -> conv; the projection shortcut reads the pre-activated input) -> final GN -> ReLU -> global
average pool -> zero-initialised linear head. The GroupNorm and weight-standardised conv are the hybrid stem's
(vit_jax.models.resnet), with BiT's symmetric padding and epsilons.

Parameter names: `conv_root`, `block{s}/unit{u}/{gn1,conv1,gn2,conv2,gn3,conv3,conv_proj}`, `norm`, `head`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax.models import layers as L
from vit_jax.models.bit_config import BiTConfig
from vit_jax.models.resnet import GroupNorm, StdConv, symmetric_padding


def _conv(cfg: BiTConfig, cin: int, cout: int, kernel: int, stride: int = 1, **kw) -> StdConv:
    return StdConv(cin, cout, kernel, stride, padding=symmetric_padding(kernel), ws_eps=cfg.ws_eps,
                   ws_eps_in_variance=True, **kw)


class _KeySequence:
    """Parameter keys folded from one key: drawing from nnx.Rngs per parameter costs ~20 ms each under eval_shape
    (its counter update formats the traced program), 12 s for a BiT-R152x2 with its ~500 parameters."""

    def __init__(self, key: jax.Array):
        self.key, self.count = key, 0

    def params(self) -> jax.Array:
        self.count += 1
        return jax.random.fold_in(self.key, self.count)


class PreActBottleneck(nnx.Module):
    """x + conv3(relu(gn3(conv2(relu(gn2(conv1(relu(gn1(x))))))))), the 3x3 conv strided; projection when reshaped."""

    def __init__(self, cfg: BiTConfig, cin: int, features: int, stride: int, **kw):
        cout = 4 * features
        self.gn1 = GroupNorm(cin, eps=cfg.gn_eps, **kw)
        self.conv_proj = _conv(cfg, cin, cout, 1, stride, **kw) if (cin != cout or stride != 1) else None
        self.conv1 = _conv(cfg, cin, features, 1, **kw)
        self.gn2 = GroupNorm(features, eps=cfg.gn_eps, **kw)
        self.conv2 = _conv(cfg, features, features, 3, stride, **kw)
        self.gn3 = GroupNorm(features, eps=cfg.gn_eps, **kw)
        self.conv3 = _conv(cfg, features, cout, 1, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        pre = jax.nn.relu(self.gn1(x))
        shortcut = self.conv_proj(pre) if self.conv_proj is not None else x
        y = self.conv1(pre)
        y = self.conv2(jax.nn.relu(self.gn2(y)))
        y = self.conv3(jax.nn.relu(self.gn3(y)))
        return y + shortcut


class BiT(nnx.Module):
    """BiT ResNet-v2; see BiTConfig. Call: `logits, out = model(images, train=False, rng=None)` with NHWC images in
    [-1, 1]; `out["pre_logits"]` are the pooled features (what a linear probe / few-shot evaluator reads)."""

    def __init__(self, cfg: BiTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        kw = dict(param_dtype=jnp.dtype(cfg.param_dtype), rngs=_KeySequence(rngs.params()))
        self.conv_root = _conv(cfg, 3, cfg.width, 7, 2, **kw)
        cin = cfg.width
        for s, units in enumerate(cfg.layers, 1):
            features = cfg.width * 2 ** (s - 1)
            stage = nnx.Dict()
            for u in range(1, units + 1):
                stage[f"unit{u}"] = PreActBottleneck(cfg, cin, features, 2 if (u == 1 and s > 1) else 1, **kw)
                cin = 4 * features
            setattr(self, f"block{s}", stage)
        self.norm = GroupNorm(cin, eps=cfg.gn_eps, **kw)
        # Zero-initialised head, as BiT (and the ViT paper for its heads).
        self.head = (L.Linear(cin, cfg.num_classes, ("conv_out", "vocab"), kernel_init=L.zeros,
                              bias_init=L.constant(cfg.head_bias_init), **kw)
                     if cfg.num_classes else None)

    def _unit(self, unit: PreActBottleneck, x: jax.Array) -> jax.Array:
        if self.cfg.remat == "none":
            return unit(x)
        graphdef, state = nnx.split(unit)
        fn = jax.checkpoint(lambda st, y: nnx.merge(graphdef, st)(y), policy=L.SAVED_UNDER_REMAT[self.cfg.remat])
        return fn(state, x)

    def __call__(self, images: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
                 capture: tuple[str, ...] = ()) -> tuple[jax.Array, dict[str, Any]]:
        del train, rng  # no dropout or stochastic depth in BiT
        if capture:
            raise ValueError(f"capture {sorted(capture)} is a ViT option; BiT has no blocks/attention to capture")
        x = self.conv_root(images.astype(jnp.dtype(self.cfg.dtype)))
        # BiT pads the max-pool's input with zeros (not -inf): the root has no ReLU before it, as big_transfer/timm.
        x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "VALID")
        for s in range(1, len(self.cfg.layers) + 1):
            stage = getattr(self, f"block{s}")
            for u in range(1, len(stage) + 1):
                x = self._unit(stage[f"unit{u}"], x)
        x = jax.nn.relu(self.norm(x))
        features = x.astype(jnp.float32).mean(axis=(1, 2)).astype(x.dtype)
        logits = self.head(features) if self.head is not None else features
        return logits.astype(jnp.float32), {"pre_logits": features}
