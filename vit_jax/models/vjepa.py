"""V-JEPA (Bardes et al., 2024): a video ViT learns without labels by predicting, in latent space, the target
encoder's features of masked spatio-temporal blocks from the visible tubelets.

`VJEPAViT` is the video ViT (models/video.py: same parameter names, no head, no class token) plus a `predictor`
subtree, so the encoder of a V-JEPA run loads into a video classifier for fine-tuning as it is. Its forward pass
(`__call__`) is the plain video ViT's on the whole clip; `predict` is the pretraining pass: the context encoder on
the visible tokens, the narrow predictor on them and on one learned mask token per target (of the mask's type), with
fixed 3D sin-cos positions, projected back to the encoder's width.

Masks (multi-block, the paper's §3.2 / jepa's multiblock3d): each of `num_blocks` blocks covers `scale` of the
spatial grid with an aspect ratio in [aspect_min, aspect_max] at a uniform position and spans every time step; the
union of a mask's blocks is masked. So that shapes are static under jit, a mask masks exactly `num_masked` tokens
per time step (its blocks' expected coverage, `MaskSpec.num_masked`): the union's tokens first (in random order),
trimmed or topped up at random. jepa's collator instead truncates every mask of a batch to the smallest in it.
Masks are drawn per example from `fold_in(key, row)`, so they do not depend on how a batch is split.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_jax.models import layers as L
from vit_jax.models.config import ModelConfigError
from vit_jax.models.video import VideoViT
from vit_jax.models.video_config import VideoConfig
from vit_jax.models.vit import Encoder

MASK_STREAM = 0x564A4550  # fold_in constant of the masks' random stream


@dataclasses.dataclass(frozen=True)
class VJEPAConfig:
    """V-JEPA's settings (`vjepa.*`); defaults: the paper's ViT-L recipe (jepa's configs/pretrain/vitl16.yaml)."""

    predictor_width: int = 384
    predictor_depth: int = 12
    predictor_heads: int = 12
    short_blocks: int = 8  # short-range masks: 8 blocks of 15% of the frame each
    short_scale: float = 0.15
    long_blocks: int = 2  # long-range masks: 2 blocks of 70%
    long_scale: float = 0.7
    aspect_min: float = 0.75
    aspect_max: float = 1.5
    ema_start: float = 0.998  # the target encoder's momentum, linear to ema_end over the run
    ema_end: float = 1.0
    # 1: the target is the encoder's output (the paper's). K > 1: the average of the last K blocks' outputs, each
    # layer-normalised, normalised again (data2vec's targets, Baevski et al. 2022): lower blocks add detail that
    # a small encoder's last block alone does not carry.
    target_blocks: int = 1
    # 2: every step predicts both mask types from each clip (the paper's). 1: each step draws one of the two types
    # (each with probability 1/2) for the whole batch: about half the context-encoder and predictor compute a step,
    # for runs whose time budget would otherwise cut their steps.
    masks_per_step: int = 2

    def __post_init__(self):
        if min(self.predictor_width, self.predictor_depth, self.predictor_heads, self.short_blocks,
               self.long_blocks, self.target_blocks) < 1 or self.predictor_width % self.predictor_heads:
            raise ModelConfigError("vjepa.predictor_width, predictor_depth, predictor_heads, short_blocks, "
                                   "long_blocks and target_blocks must be positive, the width a multiple of the heads")
        if not (0 < self.short_scale < 1 and 0 < self.long_scale < 1 and 0 < self.aspect_min <= self.aspect_max):
            raise ModelConfigError("vjepa: short_scale and long_scale must be in (0, 1), 0 < aspect_min <= aspect_max")
        if self.masks_per_step not in (1, 2):
            raise ModelConfigError(f"vjepa.masks_per_step must be 1 or 2, not {self.masks_per_step}")
        if not 0.0 <= self.ema_start <= self.ema_end <= 1.0:
            raise ModelConfigError(f"vjepa: 0 <= ema_start ({self.ema_start}) <= ema_end ({self.ema_end}) <= 1")

    def masks(self) -> tuple["MaskSpec", "MaskSpec"]:
        """The short-range and the long-range mask."""
        aspect = (self.aspect_min, self.aspect_max)
        return (MaskSpec(self.short_blocks, self.short_scale, aspect),
                MaskSpec(self.long_blocks, self.long_scale, aspect))


@dataclasses.dataclass(frozen=True)
class MaskSpec:
    num_blocks: int
    scale: float
    aspect: tuple[float, float]

    def block_size(self, grid: tuple[int, int], aspect: float) -> tuple[int, int]:
        """(rows, columns) of a block covering `scale` of the (gh, gw) grid at `aspect` (rows / columns)."""
        area = self.scale * grid[0] * grid[1]
        h = int(round(math.sqrt(area * aspect)))
        w = int(round(math.sqrt(area / aspect)))
        return min(max(h, 1), grid[0]), min(max(w, 1), grid[1])

    def num_masked(self, grid: tuple[int, int]) -> int:
        """Tokens masked per time step: the expected coverage of the union of the blocks (independent uniform
        placements and log-uniform aspects, the aspect range taken at 16 points), at least 1, at most all but one."""
        n = grid[0] * grid[1]
        rows, cols = np.mgrid[:grid[0], :grid[1]]
        lo, hi = np.log(self.aspect)
        cover = np.zeros(grid)
        for log_aspect in lo + (hi - lo) * (np.arange(16) + 0.5) / 16:
            h, w = self.block_size(grid, float(np.exp(log_aspect)))
            # P(one block of h x w contains the token): the share of its placements that do.
            cover += (np.minimum(rows, grid[0] - h) - np.maximum(rows - h + 1, 0) + 1) / (grid[0] - h + 1) * \
                     (np.minimum(cols, grid[1] - w) - np.maximum(cols - w + 1, 0) + 1) / (grid[1] - w + 1) / 16
        expected = float((1.0 - (1.0 - cover) ** self.num_blocks).sum())
        return min(n - 1, max(1, int(round(expected))))


def block_union(key: jax.Array, spec: MaskSpec, grid: tuple[int, int]) -> jax.Array:
    """(gh*gw,) bool: the union of `spec.num_blocks` blocks, each of a random aspect at a uniform position.

    One uniform draw of (num_blocks, 3) gives every block's log-aspect, row and column, and the blocks are compared
    with the grid all at once: a draw per block (split, uniform, two randint) made the train step slow to compile,
    each Threefry call being unrolled into the program."""
    gh, gw = grid
    u = jax.random.uniform(key, (spec.num_blocks, 3))
    lo, hi = math.log(spec.aspect[0]), math.log(spec.aspect[1])
    aspect = jnp.exp(lo + (hi - lo) * u[:, 0])
    area = spec.scale * gh * gw
    h = jnp.clip(jnp.round(jnp.sqrt(area * aspect)), 1, gh).astype(jnp.int32)
    w = jnp.clip(jnp.round(jnp.sqrt(area / aspect)), 1, gw).astype(jnp.int32)
    # a uniform integer in [0, g - size]: floor(u * (g - size + 1)), the min guarding u's float rounding up to 1
    y = jnp.minimum(jnp.floor(u[:, 1] * (gh - h + 1)).astype(jnp.int32), gh - h)[:, None, None]
    x = jnp.minimum(jnp.floor(u[:, 2] * (gw - w + 1)).astype(jnp.int32), gw - w)[:, None, None]
    rows, cols = jnp.arange(gh)[None, :, None], jnp.arange(gw)[None, None, :]
    inside = (rows >= y) & (rows < y + h[:, None, None]) & (cols >= x) & (cols < x + w[:, None, None])
    return inside.any(axis=0).reshape(-1)


def mask_order(key: jax.Array, spec: MaskSpec, grid: tuple[int, int, int]) -> jax.Array:
    """(nt*gh*gw,) int32 token indices: the context's first (N - nt*num_masked of them), then the targets. Per time
    step the same spatial positions are masked (blocks span the clip): the union's first, in random order."""
    nt, gh, gw = grid
    k_blocks, k_order = jax.random.split(key)
    union = block_union(k_blocks, spec, (gh, gw))
    score = union.astype(jnp.float32) + 0.5 * jax.random.uniform(k_order, (gh * gw,))  # union first, random within
    spatial = jnp.argsort(score)  # ascending: context positions first, masked positions last
    tokens = (jnp.arange(nt)[None, :] * gh * gw + spatial[:, None])  # (gh*gw, nt): each position in every step
    k = spec.num_masked((gh, gw))
    return jnp.concatenate([tokens[:gh * gw - k].reshape(-1), tokens[gh * gw - k:].reshape(-1)]).astype(jnp.int32)


def mask_orders(key: jax.Array, rows: jax.Array, spec: MaskSpec, grid: tuple[int, int, int]) -> jax.Array:
    """(B, N) orders of a batch, row i's from fold_in(key, rows[i])."""
    return jax.vmap(lambda r: mask_order(jax.random.fold_in(key, r), spec, grid))(rows)


def posemb_sincos_3d(nt: int, gh: int, gw: int, width: int) -> np.ndarray:
    """Fixed 3D sin-cos position embedding (1, nt*gh*gw, width), as jepa's: time, rows and columns each get a third
    of the width (rounded down to an even count), half sines and half cosines; channels left over are zero."""
    d = (width // 3) // 2 * 2
    parts = []
    for axis in range(3):
        pos = np.meshgrid(np.arange(nt), np.arange(gh), np.arange(gw), indexing="ij")[axis].reshape(-1)
        omega = 1.0 / 10_000 ** (np.arange(d // 2) / max(d // 2, 1))
        angle = pos[:, None] * omega[None]
        parts += [np.sin(angle), np.cos(angle)]
    out = np.concatenate(parts, axis=1)
    out = np.pad(out, ((0, 0), (0, width - out.shape[1])))
    return out[None].astype(np.float32)


def check_encoder(cfg: VideoConfig, vj: VJEPAConfig) -> None:
    if cfg.encoder != "joint" or cfg.pool != "gap" or cfg.num_classes:
        raise ModelConfigError("V-JEPA pretrains a joint video ViT without class token or head: model.video_encoder="
                               "'joint', model.pool='gap' (the objective builds it with no head)")
    if vj.target_blocks > cfg.depth:
        raise ModelConfigError(f"vjepa.target_blocks ({vj.target_blocks}) is more than the encoder's {cfg.depth} "
                               "blocks")


def layer_norm(x: jax.Array) -> jax.Array:
    """LayerNorm over the features without affine parameters (jepa's F.layer_norm on the targets), in float32."""
    x = x.astype(jnp.float32)
    return (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-6)


class Predictor(nnx.Module):
    """Narrow Transformer: encoder width -> predictor width, mask tokens (one per mask type) at the targets, fixed 3D
    positions, blocks, LayerNorm, back to the encoder width."""

    def __init__(self, cfg: VideoConfig, vj: VJEPAConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        pw = vj.predictor_width
        self.embed = L.Linear(cfg.width, pw, ("embed", "mlp"), kernel_init=L.xavier_uniform_flat(1), param_dtype=pd,
                              rngs=rngs)
        self.mask_tokens = L.param(rngs, L.zeros, (2, 1, pw), pd, (None, None, "embed"))  # jepa: zero-initialised
        blocks = VideoConfig(num_classes=0, num_frames=cfg.num_frames, image_size=cfg.image_size,
                             patch_size=cfg.patch_size, tubelet=cfg.tubelet, width=pw, depth=vj.predictor_depth,
                             mlp_dim=4 * pw, num_heads=vj.predictor_heads, pool="gap", gelu=cfg.gelu,
                             param_dtype=cfg.param_dtype, dtype=cfg.dtype)
        self.transformer = Encoder(blocks.encoder_config(vj.predictor_depth), rngs=rngs)
        self.proj = L.Linear(pw, cfg.width, ("mlp", "embed"), kernel_init=L.xavier_uniform_flat(1), param_dtype=pd,
                             rngs=rngs)
        self.grid, self.width = cfg.grid, pw  # positions are fixed: computed when called, not stored as state

    def __call__(self, context: jax.Array, order: jax.Array, num_context: int, mask_type: int) -> jax.Array:
        """context (B, K, D) in `order`'s first K places -> predicted features (B, N - K, D) of the rest."""
        b, n = order.shape
        table = jnp.asarray(posemb_sincos_3d(*self.grid, self.width)[0])
        pos = jnp.take(table, order, axis=0).astype(context.dtype)  # (B, N, pw)
        x = self.embed(context) + pos[:, :num_context]
        token = self.mask_tokens[...][mask_type].astype(x.dtype)
        x = jnp.concatenate([x, jnp.broadcast_to(token, (b, n - num_context, token.shape[-1])) + pos[:, num_context:]],
                            axis=1)
        x, _, _ = self.transformer(x)
        return self.proj(x[:, num_context:])


class VJEPAViT(VideoViT):
    """A video ViT encoder (no head) and a V-JEPA predictor; FunctionalViT(cfg, partial(VJEPAViT, vjepa=...))."""

    def __init__(self, cfg: VideoConfig, *, vjepa: VJEPAConfig, rngs: nnx.Rngs):
        check_encoder(cfg, vjepa)
        super().__init__(cfg, rngs=rngs)
        self.predictor = Predictor(cfg, vjepa, rngs=rngs)
        self.target_blocks = vjepa.target_blocks

    def tokens(self, clips: jax.Array) -> jax.Array:
        """Clips -> tubelet tokens with their positions (B, N, D)."""
        x = self.embed(clips)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        return x + self.pos_embedding[...].astype(x.dtype)

    def targets(self, clips: jax.Array) -> jax.Array:
        """The target encoder's view (this module holding the EMA parameters): every token's features after the
        encoder, layer-normalised without affine parameters (jepa's F.layer_norm on the target); with
        `target_blocks` K > 1, the normalised average of the last K blocks' normalised outputs."""
        k = self.target_blocks
        x, blocks, _ = self.encoder(self.tokens(clips), capture_blocks=k > 1)
        if k == 1:
            return layer_norm(x)
        return layer_norm(layer_norm(blocks[-k:]).mean(axis=0))  # blocks: (depth, B, N, D), normalised per token

    def predict(self, tokens: jax.Array, order: jax.Array, num_context: int, mask_type: int,
                rng: jax.Array | None = None) -> jax.Array:
        """Context encoder on the first `num_context` of `tokens` (B, N, D) in `order` (the clip's `tokens`, embedded
        once for every mask), then the predictor -> (B, N - K, D) predictions."""
        x = jnp.take_along_axis(tokens, order[:, :num_context, None], axis=1)
        context, _, _ = self.encoder(x, key=rng)
        return self.predictor(context, order, num_context, mask_type)
