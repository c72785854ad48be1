"""The model of DINO / iBOT / DINOv2 self-distillation (Caron et al. 2021; Zhou et al. 2022; Oquab et al. 2023).

`DinoViT` is the project's ViT (same parameter names and shapes, no classification head) plus the DINO head
(`dino_head`), iBOT's `mask_token`, and, with `separate_ibot_head`, an `ibot_head`. Its plain forward pass is the
ViT's (the class token is `pre_logits`: what few-shot and k-NN probes read), so a DINO run's encoder loads into a
classifier as it is. `encode` is the pretraining pass: any crop size (the position embedding is interpolated to the
crop's patch grid, as DINO runs its 96 px local crops through a model built for 224 px), and masked patches replaced
by the mask token before the position embedding is added (iBOT, DINOv2).

The teacher is the same module with the EMA weights (train/objectives/dino.py holds them as extra state).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax.models import layers as L
from vit_jax.models.config import ModelConfigError, ViTConfig
from vit_jax.models.posemb_resize import resize_dinov2
from vit_jax.models.vit import ViT, posemb_sincos_2d


@dataclasses.dataclass(frozen=True)
class DinoHeadConfig:
    """Sizes of the DINO head: `layers` Linear layers (GELU between; the first layer-1 of width `hidden`, the last
    to `bottleneck`), L2 normalisation, and a bias-free weight-normalised layer to `prototypes` outputs."""

    hidden: int = 2048
    bottleneck: int = 256
    prototypes: int = 65_536
    layers: int = 3

    def __post_init__(self):
        if min(self.hidden, self.bottleneck, self.prototypes, self.layers) <= 0:
            raise ModelConfigError("dino.head_hidden, head_bottleneck, prototypes and head_layers must be > 0")

    def layer_sizes(self, dim: int) -> list[int]:
        """Input and output widths of the Linear layers, in order: dim -> hidden ... -> bottleneck."""
        return [dim] + [self.hidden] * (self.layers - 1) + [self.bottleneck]


def trunc_normal(std: float):
    """timm's trunc_normal_(std) as DINO initialises its head: a normal of `std` cut at +-2 (absolute)."""
    def init(key, shape, dtype):
        return jnp.clip(std * jax.random.truncated_normal(key, -2.0 / std, 2.0 / std, shape, dtype), -2.0, 2.0)

    return init


class DINOHead(nnx.Module):
    """MLP -> bottleneck -> L2-normalise -> prototypes with unit-norm weight columns (weight norm with g = 1)."""

    def __init__(self, dim: int, head: DinoHeadConfig, *, param_dtype, rngs: nnx.Rngs):
        sizes = head.layer_sizes(dim)
        self.depth = len(sizes) - 1
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):  # named layer0.. (checkpoint keys are strings)
            setattr(self, f"layer{i}", L.Linear(a, b, ("embed", "mlp"), kernel_init=trunc_normal(0.02),
                                                param_dtype=param_dtype, rngs=rngs))
        # weight_v of PyTorch's weight_norm; weight_g is fixed at 1 (DINO's norm_last_layer), so only directions learn.
        self.prototypes = L.param(rngs, trunc_normal(0.02), (head.bottleneck, head.prototypes), param_dtype,
                                  ("mlp", "vocab"))

    def __call__(self, x: jax.Array) -> jax.Array:
        for i in range(self.depth):
            x = getattr(self, f"layer{i}")(x)
            if i < self.depth - 1:
                x = jax.nn.gelu(x, approximate=False)
        x = x.astype(jnp.float32)
        x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # F.normalize's eps
        v = self.prototypes[...].astype(jnp.float32)
        return x @ (v / jnp.linalg.norm(v, axis=0, keepdims=True))


def check_encoder(cfg: ViTConfig) -> None:
    """DINO runs crops of other sizes and masks patch embeddings: a plain ViT with a class token."""
    bad = [name for name, on in (("window_size", cfg.window_size), ("rel_pos", cfg.rel_pos), ("dense", cfg.dense),
                                 ("resnet_layers", cfg.resnet_layers), ("rep_size", cfg.rep_size),
                                 ("distilled", cfg.distilled), ("pool!='token'", cfg.pool != "token")) if on]
    if bad:
        raise ModelConfigError(f"objective 'dino' pretrains a plain ViT with a class token; model."
                               f"{', model.'.join(bad)} is not supported (use pool='token' and the defaults)")
    if cfg.num_classes:
        raise ModelConfigError("a DINO model has no classification head: build it with num_classes=0")


class DinoViT(ViT):
    """A ViT encoder (no classification head), the DINO head, iBOT's mask token and optionally its own head.
    `module=functools.partial(DinoViT, head=..., separate_ibot_head=...)` in FunctionalViT."""

    def __init__(self, cfg: ViTConfig, *, head: DinoHeadConfig, separate_ibot_head: bool = False, rngs: nnx.Rngs):
        check_encoder(cfg)
        super().__init__(cfg, rngs=rngs)
        pd = jnp.dtype(cfg.param_dtype)
        self.dino_head = DINOHead(cfg.width, head, param_dtype=pd, rngs=rngs)
        self.ibot_head = DINOHead(cfg.width, head, param_dtype=pd, rngs=rngs) if separate_ibot_head else None
        self.mask_token = L.param(rngs, L.zeros, (1, 1, cfg.width), pd, (None, None, "embed"))

    def positions(self, grid: tuple[int, int], dtype) -> tuple[jax.Array, jax.Array]:
        """The position embeddings of the class token (1, 1, D) and of a `grid` of patches (1, gh*gw, D): the
        learned table resized from the model's grid (DINO's interpolate_pos_encoding: bicubic, or DINOv2's offset
        bicubic with model.posemb_resize='dinov2'), or sin-cos computed for the grid."""
        cfg = self.cfg
        if self.pos_embedding is None:
            return jnp.zeros((1, 1, cfg.width), dtype), jnp.asarray(posemb_sincos_2d(*grid, cfg.width), dtype)
        pe = self.pos_embedding[...].astype(jnp.float32)
        cls_pe, patch_pe = pe[:, :1], pe[:, 1:]
        if tuple(grid) != tuple(cfg.grid):
            table = patch_pe.reshape(1, *cfg.grid, cfg.width)
            if cfg.posemb_resize == "dinov2":
                patch_pe = resize_dinov2(table, grid, jnp).reshape(1, -1, cfg.width)
            else:
                patch_pe = jax.image.resize(table, (1, *grid, cfg.width), "cubic").reshape(1, -1, cfg.width)
        return cls_pe.astype(dtype), patch_pe.astype(dtype)

    def encode(self, images: jax.Array, masks: jax.Array | None = None, *,
               rng: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Images (B, H, W, 3) of any size divisible by the patch size, optional masks (B, N) (True: replace that
        patch's embedding with the mask token) -> (class tokens (B, D), patch tokens (B, N, D)) after the final
        LayerNorm. `rng` (training) drives dropout and stochastic depth."""
        cfg = self.cfg
        x = self.embedding(images.astype(jnp.dtype(cfg.dtype)))
        grid = (images.shape[1] // cfg.patch_size[0], images.shape[2] // cfg.patch_size[1])
        if masks is not None:
            x = jnp.where(masks[..., None], self.mask_token[...].astype(x.dtype), x)
        cls_pe, patch_pe = self.positions(grid, x.dtype)
        cls = jnp.broadcast_to(self.cls[...].astype(x.dtype) + cls_pe, (x.shape[0], 1, cfg.width))
        regs = ([] if self.reg is None else  # register tokens (no position) after the class token
                [jnp.broadcast_to(self.reg[...].astype(x.dtype), (x.shape[0], cfg.registers, cfg.width))])
        x = jnp.concatenate([cls, *regs, x + patch_pe], axis=1)
        k_embed, k_enc = jax.random.split(rng) if rng is not None else (None, None)
        x = L.dropout(x, cfg.dropout, k_embed)
        encoded, _, _ = self.encoder(x, key=k_enc)
        return encoded[:, 0], encoded[:, 1 + cfg.registers:]

    def heads(self, cls: jax.Array, patches: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
        """Class tokens (..., D) -> DINO logits (..., K); patch tokens (..., N, D) -> iBOT logits through the iBOT
        head (the DINO head unless separate)."""
        dino = self.dino_head(cls)
        if patches is None:
            return dino, None
        return dino, (self.ibot_head or self.dino_head)(patches)
