"""The video ViT family (ViViT) on the model-family registry (models/family.py): its training-config keys, config
construction, description, analytic FLOPs and report label. Its checkpoint formats (transformers' ViViT, inflation
of an image ViT): checkpoints/video_formats.py."""

from __future__ import annotations

from typing import Any, Mapping

from vit_jax.models import family
from vit_jax.models.flops import Flops, _block_flops
from vit_jax.models.video import VideoViT
from vit_jax.models.video_config import VideoConfig, is_video_name, video_config

# The model.* keys a video ViT reads. Keys the ViT family also reads keep its defaults (the first family to name a
# key sets it: 0 = the variant's size); the video keys default to the paper's Kinetics setting (32 frames, 2-frame
# tubelets), video_encoder "" = the variant's (ViViT-FE-... is factorised), temporal_depth 0 = 4.
SCHEMA = {"variant": "Ti/16", "image_size": 224, "patch_size": 0, "width": 0, "depth": 0, "mlp_dim": 0,
          "num_heads": 0, "pool": "token", "gelu": "tanh", "drop_path": 0.0, "dtype": "float32",
          "param_dtype": "float32", "remat": "none", "head_bias_init": 0.0, "num_frames": 32, "tubelet": 0,
          "video_encoder": "", "temporal_depth": 0}
_SIZED = ("patch_size", "width", "depth", "mlp_dim", "num_heads", "tubelet")  # 0 = the variant's


def from_training_config(m: Mapping[str, Any], num_classes: int,
                         architecture: VideoConfig | None = None) -> VideoConfig:
    """The VideoConfig of `model.variant` ("ViViT-B/16x2"), or of the init checkpoint's video `architecture` when the
    variant is empty; non-zero sizes override the variant's; the head size comes from the dataset."""
    kw = {k: m[k] for k in ("image_size", "pool", "gelu", "drop_path", "dtype", "param_dtype", "remat",
                            "head_bias_init", "num_frames", "temporal_depth")}
    kw.update({k: m[k] for k in _SIZED if m[k]})
    if m["video_encoder"]:
        kw["encoder"] = m["video_encoder"]
    if architecture is not None and not m["variant"]:
        return architecture.replace(num_classes=num_classes, **kw)
    return video_config(m["variant"], num_classes=num_classes, **kw)


def describe(cfg: VideoConfig) -> str:
    nt, gh, gw = cfg.grid
    temporal = f", temporal depth {cfg.num_temporal_blocks}" if cfg.encoder == "factorised" else ""
    return (f"{cfg.name} (width {cfg.width}, depth {cfg.depth}{temporal}, heads {cfg.num_heads}, mlp {cfg.mlp_dim}, "
            f"{cfg.encoder} encoder, tubelet {cfg.tubelet}x{cfg.patch_size[0]}x{cfg.patch_size[1]}, clip "
            f"{cfg.num_frames}x{cfg.image_size[0]}x{cfg.image_size[1]} = {nt}x{gh}x{gw} tubelets, pool={cfg.pool}, "
            f"classes={cfg.num_classes})")


# XLA's FLOPs per element (its cost analysis on CPU, jax 0.10, as models/swin_family.py measured): a float32
# LayerNorm 6, the softmax 4 (+1 for its scale); the tanh GELU, counted the same way here, ~9.
LAYERNORM_OPS, SOFTMAX_OPS, TANH_GELU_OPS = 6, 5, 9


def _elementwise(tokens: int, d: int, m: int, heads: int, depth: int) -> float:
    """Biases, LayerNorms, residual sums, softmax and GELU of `depth` blocks over `tokens`, and the final norm."""
    per_block = tokens * d * (2 * LAYERNORM_OPS + 2 + 4) + tokens * m * (1 + TANH_GELU_OPS) \
        + heads * tokens * tokens * SOFTMAX_OPS
    return depth * per_block + tokens * d * LAYERNORM_OPS


def video_flops(cfg: VideoConfig) -> Flops:
    """Forward FLOPs per clip: `matmul` parts (2 per multiply-add) for the tubelet embedding, the encoder(s) and the
    head, and `elementwise` (a few percent at ViViT-B's size, more on tiny models)."""
    nt, gh, gw = cfg.grid
    d, m, h = cfg.width, cfg.mlp_dim, cfg.num_heads
    cls = 1 if cfg.pool == "token" else 0
    (ph, pw), t = cfg.patch_size, cfg.tubelet
    parts = {"tubelet_embedding": 2.0 * nt * gh * gw * t * ph * pw * 3 * d}
    elementwise = 2.0 * nt * gh * gw * d  # the embedding's bias and the position embedding
    if cfg.encoder == "joint":
        tokens = nt * gh * gw + cls
        parts["encoder"] = cfg.depth * _block_flops(tokens, d, m)
        elementwise += _elementwise(tokens, d, m, h, cfg.depth)
    else:
        tokens = gh * gw + cls
        parts["spatial_encoder"] = nt * cfg.depth * _block_flops(tokens, d, m)
        parts["temporal_encoder"] = cfg.num_temporal_blocks * _block_flops(nt + cls, d, m)
        elementwise += nt * _elementwise(tokens, d, m, h, cfg.depth) + \
            _elementwise(nt + cls, d, m, h, cfg.num_temporal_blocks)
    if cfg.num_classes:
        parts["head"] = 2.0 * d * cfg.num_classes
    parts["elementwise"] = float(elementwise)
    return Flops(forward=sum(parts.values()), breakdown=parts)


VIDEO = family.register(family.Family(
    name="Video", config_type=VideoConfig, module=VideoViT, schema=SCHEMA, owns_variant=is_video_name,
    from_training_config=from_training_config, from_meta=lambda model: video_config(**model), describe=describe,
    flops=video_flops, label=lambda cfg: "ViViT"))
