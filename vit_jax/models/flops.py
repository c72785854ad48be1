"""Analytic FLOPs of a ViT or BiT ResNet forward pass per image (2 FLOPs per multiply-accumulate, attention included).

Only matrix products and convolutions are counted (elementwise work is a few percent and depends on fusion); a
training step is taken as 3x the forward pass (forward + backward w.r.t. activations and weights), the convention
of the ViT paper's compute figures (Table 6, Fig. 5).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from vit_jax.models.config import ViTConfig

if TYPE_CHECKING:  # models/mae.py and mpp.py import JAX; this module stays pure Python
    from vit_jax.models.mae import MAEConfig
    from vit_jax.models.bit_config import BiTConfig
    from vit_jax.models.mpp import MPPConfig


@dataclasses.dataclass(frozen=True)
class Flops:
    forward: float  # per image
    breakdown: dict  # forward FLOPs per component
    # Forward-only work a training step also runs per image (a frozen teacher): no backward pass, so counted once.
    frozen_forward: float = 0.0

    @property
    def train(self) -> float:
        return 3.0 * self.forward + self.frozen_forward


def _resnet_flops(image_size: tuple[int, int], layers: tuple[int, ...],
                  width_factor: int) -> tuple[float, int, int, int]:
    """FLOPs of a BiT-style ResNet (root conv and bottleneck stages, the hybrid stem's or BiT's) and the (height,
    width, channels) of its output. Both paddings (TF SAME, BiT's symmetric) give ceil(size / stride) outputs."""
    h, w = image_size
    width = 64 * width_factor

    def conv(hout, wout, k, cin, cout):
        return 2.0 * hout * wout * k * k * cin * cout

    h, w = -(-h // 2), -(-w // 2)
    total = conv(h, w, 7, 3, width)
    h, w = -(-h // 2), -(-w // 2)  # max-pool
    cin = width
    for s, units in enumerate(layers, 1):
        f = width * 2 ** (s - 1)
        for u in range(1, units + 1):
            stride = 2 if (u == 1 and s > 1) else 1
            ho, wo = -(-h // stride), -(-w // stride)
            if cin != 4 * f or stride != 1:
                total += conv(ho, wo, 1, cin, 4 * f)
            total += conv(h, w, 1, cin, f) + conv(ho, wo, 3, f, f) + conv(ho, wo, 1, f, 4 * f)
            h, w, cin = ho, wo, 4 * f
    return total, h, w, cin


def _block_flops(tokens: int, width: int, mlp_dim: int) -> float:
    """One Transformer block over a flat sequence: q, k, v projections, q.k logits and weights.v, the output
    projection, and the MLP."""
    t, d = tokens, width
    return 2.0 * t * d * 3 * d + 2.0 * 2 * t * t * d + 2.0 * t * d * d + 2.0 * 2 * t * d * mlp_dim


def ffn_flops_dim(cfg: ViTConfig) -> float:
    """The hidden size a GELU MLP of equal FLOPs would have: SwiGLU multiplies by three D x mlp_dim matrices (gate,
    value, out) where the MLP has two."""
    return cfg.mlp_dim * (1.5 if cfg.ffn == "swiglu" else 1.0)


def _grid_block_flops(cfg: ViTConfig, block: int) -> float:
    """One block attending on the patch grid: windows see the padded grid (projections and attention run on the
    padding too, as in SAM), and the decomposed relative position bias costs q . R for rows and for columns."""
    d, (gh, gw) = cfg.width, cfg.grid
    sh, sw = cfg.attention_size(block)
    tokens = (-(-gh // sh) * sh) * (-(-gw // sw) * sw)  # the grid padded to whole windows
    flops = 2.0 * tokens * d * 3 * d + 2.0 * 2 * tokens * sh * sw * d + 2.0 * tokens * d * d
    if cfg.rel_pos:
        flops += 2.0 * tokens * (sh + sw) * d
    return flops + 2.0 * 2 * gh * gw * d * ffn_flops_dim(cfg)


def bit_flops(cfg: "BiTConfig") -> Flops:
    """Forward FLOPs per image of a BiT ResNet-v2 at `cfg.image_size` (convolutions and the head)."""
    parts: dict[str, float] = {}
    parts["resnet"], _, _, channels = _resnet_flops(cfg.image_size, cfg.layers, cfg.width_factor)
    if cfg.num_classes:
        parts["head"] = 2.0 * channels * cfg.num_classes
    return Flops(forward=sum(parts.values()), breakdown=parts)


def vit_flops(cfg: ViTConfig) -> Flops:
    d, m, depth = cfg.width, ffn_flops_dim(cfg), cfg.depth
    n, t = cfg.num_patches, cfg.seq_len
    ph, pw = cfg.patch_size
    parts: dict[str, float] = {}
    cin = 3
    if cfg.resnet_layers:
        parts["stem"], _, _, cin = _resnet_flops(cfg.image_size, cfg.resnet_layers, cfg.resnet_width)
    parts["patch_embedding"] = 2.0 * n * ph * pw * cin * d
    if cfg.spatial_attention:
        parts["encoder"] = sum(_grid_block_flops(cfg, i) for i in range(depth))
    else:
        parts["encoder"] = depth * _block_flops(t, d, m)
    if cfg.neck_dim:  # 1x1 conv, then 3x3 conv (no biases)
        parts["neck"] = 2.0 * n * (d * cfg.neck_dim + 9 * cfg.neck_dim * cfg.neck_dim)
    if cfg.pool == "map":
        parts["map_head"] = 2.0 * (d * d + n * d * 2 * d + 2 * n * d + d * d + 2 * d * cfg.mlp_dim)  # a GELU MLP
    feat = d
    if cfg.rep_size:
        parts["pre_logits"] = 2.0 * d * cfg.rep_size
        feat = cfg.rep_size
    if cfg.num_classes:
        parts["head"] = 2.0 * feat * cfg.num_classes
    if cfg.distilled:
        parts["head_dist"] = 2.0 * feat * cfg.num_classes
    return Flops(forward=sum(parts.values()), breakdown=parts)


def mae_flops(cfg: ViTConfig, mae: MAEConfig) -> Flops:
    """Forward FLOPs per image of MAE pretraining: every patch is embedded, the encoder runs on the visible ones
    (and the class token), the decoder on all of them."""
    d, n, (ph, pw) = cfg.width, cfg.num_patches, cfg.patch_size
    dw = mae.decoder_width
    cls = 1 if cfg.pool == "token" else 0
    t_enc, t_dec = mae.num_visible(n) + cls, n + cls
    parts = {
        "patch_embedding": 2.0 * n * ph * pw * 3 * d,
        "encoder": cfg.depth * _block_flops(t_enc, d, ffn_flops_dim(cfg)),
        "decoder_embed": 2.0 * t_enc * d * dw,
        "decoder": mae.decoder_depth * _block_flops(t_dec, dw, mae.decoder_mlp_dim),
        "decoder_pred": 2.0 * n * dw * ph * pw * 3,
    }
    return Flops(forward=sum(parts.values()), breakdown=parts)


def mpp_flops(cfg: ViTConfig, mpp: MPPConfig) -> Flops:
    """Forward FLOPs per image of masked patch prediction: the headless ViT on every patch (corrupted or not), and
    the prediction head on the corrupted patches' tokens."""
    parts = dict(vit_flops(cfg.replace(num_classes=0)).breakdown)
    parts["mpp_head"] = 2.0 * mpp.num_corrupted(cfg.num_patches) * cfg.width * mpp.num_outputs(cfg.patch_size)
    return Flops(forward=sum(parts.values()), breakdown=parts)


def segmentation_flops(cfg: ViTConfig, num_classes: int) -> Flops:
    """Forward FLOPs per image of the dense ViT with its pixel head (models/segmentation.py): every token's
    features -> the logits of its patch's pixels."""
    base = vit_flops(cfg)
    h, w = cfg.image_size
    parts = {**base.breakdown, "pixel_head": 2.0 * (cfg.neck_dim or cfg.width) * h * w * num_classes}
    return Flops(forward=sum(parts.values()), breakdown=parts)
