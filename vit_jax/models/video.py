"""Video ViT (ViViT, Arnab et al. 2021) in Flax NNX: tubelet embedding, then a joint or a factorised encoder.

Clip (B, T, H, W, 3) in [-1, 1] -> tubelets of t x p x p pixels embedded as by a 3D convolution (kernel = stride, VALID:
`embedding/kernel` (t, p, p, 3, D)) -> tokens in (time, row, column) order -> one of:
- joint: [class token] + tokens, plus a learned space-time position embedding `pos_embedding` (1, 1 + nt*gh*gw, D)
  -> `encoder` (the image ViT's Encoder: stacked pre-LN blocks + final LayerNorm) -> class token (or mean);
- factorised: per time step, [class token] + its gh*gw tokens plus the spatial `pos_embedding` (1, 1 + gh*gw, D)
  -> `encoder` (spatial) -> per-step class tokens (B, nt, D) -> [temporal class token `temporal_cls`] + steps plus
  `temporal_pos_embedding` (1, 1 + nt, D) -> `temporal_encoder` -> class token (or mean).
-> zero-initialised linear `head`.

The encoders are the image ViT's (models/vit.py Encoder), so an image checkpoint's blocks load unchanged
(checkpoints/video_formats.py inflates the rest).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax.models import layers as L
from vit_jax.models.video_config import VideoConfig
from vit_jax.models.vit import Encoder


class TubeletEmbed(nnx.Module):
    """A (t, ph, pw, 3, D) convolution with stride = kernel: (B, T, H, W, 3) -> (B, nt, gh, gw, D).

    Computed as a matmul of the flattened tubelets (flattened as the kernel: (t, ph, pw, 3)) with the kernel, the
    same sums as the strided 3D convolution: XLA:CPU's 3D convolution took 68 ms for the demo clips' forward and
    kernel gradient (batch 128 of 8x32x32, 2x8x8 tubelets) against 13 ms as a matmul, and the video demo's train step
    175 -> 135 ms, V-JEPA's 375 -> 235 ms (docs/BENCHMARKS.md). (The image ViT's patch embedding stays a 2D
    convolution, which XLA:CPU runs well: layers.PatchEmbed.)"""

    def __init__(self, tubelet: int, patch_size: tuple[int, int], dim: int, *, param_dtype, rngs):
        self.kernel = L.param(rngs, L.lecun_normal(4), (tubelet, *patch_size, 3, dim), param_dtype,
                              (None, None, None, None, "embed"))
        self.bias = L.param(rngs, L.zeros, (dim,), param_dtype, ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...].astype(x.dtype)
        t, ph, pw, c, d = kernel.shape
        b, frames, h, w, _ = x.shape
        nt, gh, gw = frames // t, h // ph, w // pw
        tubelets = x.reshape(b, nt, t, gh, ph, gw, pw, c).transpose(0, 1, 3, 5, 2, 4, 6, 7)
        y = jnp.einsum("bthwi,io->bthwo", tubelets.reshape(b, nt, gh, gw, t * ph * pw * c), kernel.reshape(-1, d))
        return y + self.bias[...].astype(x.dtype)


class VideoViT(nnx.Module):
    """Video ViT; see VideoConfig. Call: `logits, out = model(clips, train=False, rng=None)` with clips
    (B, T, H, W, 3); `out["pre_logits"]` are the pooled features, `out["encoded"]` the tokens after the (last)
    encoder's LayerNorm (joint: (B, 1 + nt*gh*gw, D) with the class token first)."""

    def __init__(self, cfg: VideoConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        pd = jnp.dtype(cfg.param_dtype)
        kw = dict(param_dtype=pd, rngs=rngs)
        nt, gh, gw = cfg.grid
        cls = 1 if cfg.pool == "token" else 0
        self.embedding = TubeletEmbed(cfg.tubelet, cfg.patch_size, cfg.width, **kw)
        self.cls = L.param(rngs, L.zeros, (1, 1, cfg.width), pd, (None, None, "embed")) if cls else None
        rows = (nt if cfg.encoder == "joint" else 1) * gh * gw + cls
        self.pos_embedding = L.param(rngs, L.normal(0.02), (1, rows, cfg.width), pd, (None, None, "embed"))
        self.encoder = Encoder(cfg.encoder_config(cfg.depth), rngs=rngs)
        if cfg.encoder == "factorised":
            self.temporal_cls = (L.param(rngs, L.zeros, (1, 1, cfg.width), pd, (None, None, "embed"))
                                 if cls else None)
            self.temporal_pos_embedding = L.param(rngs, L.normal(0.02), (1, nt + cls, cfg.width), pd,
                                                  (None, None, "embed"))
            self.temporal_encoder = Encoder(cfg.encoder_config(cfg.num_temporal_blocks), rngs=rngs)
        self.head = (L.Linear(cfg.width, cfg.num_classes, ("embed", "vocab"), kernel_init=L.zeros,
                              bias_init=L.constant(cfg.head_bias_init), **kw) if cfg.num_classes else None)

    def embed(self, clips: jax.Array) -> jax.Array:
        """Clips -> tubelet embeddings (B, nt, gh, gw, D), before any position embedding."""
        cfg = self.cfg
        if tuple(clips.shape[1:]) != cfg.input_shape:
            raise ValueError(f"clips of shape {tuple(clips.shape[1:])} given to a video model built for "
                             f"{cfg.input_shape} (num_frames, height, width, channels)")
        return self.embedding(clips.astype(jnp.dtype(cfg.dtype)))

    def _encode(self, encoder: Encoder, tokens: jax.Array, cls, pos: jax.Array, key) -> jax.Array:
        """[cls] + tokens (B, N, D), plus `pos`, through `encoder`: (B, N (+1), D) after its LayerNorm."""
        x = tokens + pos[:, -tokens.shape[1]:].astype(tokens.dtype)
        if cls is not None:
            prefix = (cls[...] + pos[:, :1]).astype(tokens.dtype)
            x = jnp.concatenate([jnp.broadcast_to(prefix, (x.shape[0], 1, x.shape[2])), x], 1)
        return encoder(x, key=key)[0]

    def _pool(self, encoded: jax.Array) -> jax.Array:
        return encoded[:, 0] if self.cfg.pool == "token" else encoded.mean(axis=1)

    def __call__(self, clips: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
                 capture: tuple[str, ...] = ()) -> tuple[jax.Array, dict[str, Any]]:
        cfg = self.cfg
        if capture:
            raise ValueError(f"capture {sorted(capture)} is not available for a video model; its tokens are "
                             "out['encoded']")
        stochastic = train and cfg.drop_path > 0
        if stochastic and rng is None:
            raise ValueError("train=True with drop_path needs an `rng` key")
        k_space, k_time = jax.random.split(rng) if stochastic else (None, None)
        x = self.embed(clips)
        b, nt, gh, gw, d = x.shape
        pos = self.pos_embedding[...]
        if cfg.encoder == "joint":
            encoded = self._encode(self.encoder, x.reshape(b, nt * gh * gw, d), self.cls, pos, k_space)
        else:
            steps = self._encode(self.encoder, x.reshape(b * nt, gh * gw, d), self.cls, pos, k_space)
            per_step = self._pool(steps).reshape(b, nt, d)
            encoded = self._encode(self.temporal_encoder, per_step, self.temporal_cls,
                                   self.temporal_pos_embedding[...], k_time)
        features = self._pool(encoded)
        logits = self.head(features) if self.head is not None else features
        return logits.astype(jnp.float32), {"encoded": encoded, "pre_logits": features}
