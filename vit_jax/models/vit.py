"""The Vision Transformer (Dosovitskiy et al., 2021) in Flax NNX.

Image -> (optional BiT ResNet stem) -> P x P patches linearly embedded -> [class token] + position embeddings ->
pre-LN Transformer blocks -> final LayerNorm -> pooling (class token, global average, or attention pooling) ->
(optional pre-logits Dense+tanh) -> linear head.

Encoder blocks are always stored stacked along a leading `layers` axis: the same parameters (and checkpoints) serve
the unrolled loop and the `scan=True` single compiled block, so the choice is a compile-time switch only.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vit_jax.models import attention_impl
from vit_jax.models import layers as L
from vit_jax.models.config import ViTConfig
from vit_jax.models.resnet import ResNetStem, resnet_out_channels

def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.0) -> np.ndarray:
    """Fixed 2D sin-cos position embedding (MoCo v3 / big_vision): (1, h*w, width)."""
    y, x = np.mgrid[:h, :w]
    omega = np.arange(width // 4) / (width // 4 - 1)
    omega = 1.0 / (temperature**omega)
    y = np.einsum("m,d->md", y.flatten(), omega)
    x = np.einsum("m,d->md", x.flatten(), omega)
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)[None].astype(np.float32)


def scan_period(cfg: ViTConfig) -> int:
    """Blocks per scanned group: the shortest period of the global/windowed pattern (1 when all blocks are alike).

    `scan` needs identical steps; SAM's pattern (global blocks 2, 5, 8, 11) repeats every 3 blocks, so the scan runs
    over 4 groups of 3 unrolled blocks. An irregular pattern has period `depth`: one group, i.e. unrolled.
    """
    pattern = [cfg.is_global(i) for i in range(cfg.depth)]
    return next(p for p in range(1, cfg.depth + 1)
                if cfg.depth % p == 0 and all(pattern[i] == pattern[i % p] for i in range(cfg.depth)))


class Encoder(nnx.Module):
    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)

        @nnx.vmap(in_axes=0, out_axes=0)
        def make_blocks(key):
            return L.EncoderBlock(cfg.width, cfg.mlp_dim, cfg.num_heads, param_dtype=pd, rngs=nnx.Rngs(params=key),
                                  ln_eps=cfg.ln_eps, layer_scale=cfg.layer_scale, ffn=cfg.ffn)

        self.blocks = make_blocks(jax.random.split(rngs.params(), cfg.depth))
        for _, v in nnx.iter_graph(self.blocks):
            if isinstance(v, nnx.Variable):
                v.set_metadata(logical_axes=("layers",) + tuple(v.get_metadata()["logical_axes"]))
        # Relative position tables differ in size between windowed and global blocks, so they live per block
        # (rel_pos_0, rel_pos_1, ...) rather than in the stack.
        for i in range(cfg.depth if cfg.rel_pos else 0):
            setattr(self, f"rel_pos_{i}", L.RelPosTables(cfg.attention_size(i), cfg.width // cfg.num_heads,
                                                         param_dtype=pd, rngs=rngs))
        # SAM's encoder ends without a LayerNorm (its neck normalises); a dense backbone follows it.
        self.norm = None if cfg.dense else L.LayerNorm(cfg.width, param_dtype=pd, rngs=rngs, eps=cfg.ln_eps)
        self.cfg = cfg

    def __call__(self, x, *, key=None, capture_blocks=False, capture_attention=False):
        # The attention kernel (model.attention) is chosen while tracing the blocks; see models/attention_impl.py.
        with attention_impl.requested(self.cfg.attention):
            return self._blocks(x, key=key, capture_blocks=capture_blocks, capture_attention=capture_attention)

    def _blocks(self, x, *, key, capture_blocks, capture_attention):
        cfg = self.cfg
        if capture_attention and cfg.window_size:
            raise ValueError("capture='attention' is not available with windowed attention (the weights of "
                             "windowed and global blocks have different shapes)")
        graphdef, stacked = nnx.split(self.blocks)
        depth = cfg.depth
        rates = jnp.asarray(cfg.drop_path * np.arange(depth) / max(depth - 1, 1), jnp.float32)
        keys = jax.random.split(key, depth) if key is not None else None
        rel = [getattr(self, f"rel_pos_{i}").tables() if cfg.rel_pos else None for i in range(depth)]

        def make_block_fn(i: int):  # block i's static layout: flat sequence, grid, or windows of the grid
            layout = {}
            if cfg.spatial_attention:
                layout = dict(grid=cfg.grid, window=0 if cfg.is_global(i) else cfg.window_size)

            def block_fn(x, params, block_key, rate, rel_pos):
                block = nnx.merge(graphdef, params)
                train = block_key is not None
                y, weights = block(x, gelu_kind=cfg.gelu, dropout_rate=cfg.dropout if train else 0.0,
                                   attention_dropout=cfg.attention_dropout if train else 0.0,
                                   drop_path_rate=rate if (cfg.drop_path and train) else 0.0,
                                   key=block_key, return_weights=capture_attention, rel_pos=rel_pos, **layout)
                return y, ((y if capture_blocks else None), weights)

            if cfg.remat != "none":
                block_fn = jax.checkpoint(block_fn, policy=L.SAVED_UNDER_REMAT[cfg.remat], prevent_cse=not cfg.scan)
            return block_fn

        if cfg.scan:
            period = scan_period(cfg)
            fns = [make_block_fn(j) for j in range(period)]
            group = lambda a: a.reshape(depth // period, period, *a.shape[1:])  # noqa: E731
            rel_groups = [jax.tree.map(lambda *t: jnp.stack(t), *rel[j::period]) for j in range(period)]

            def body(x, xs):
                params, block_keys, block_rates, rels = xs
                outs = []
                for j in range(period):
                    x, out = fns[j](x, jax.tree.map(lambda a: a[j], params),
                                    None if block_keys is None else block_keys[j], block_rates[j], rels[j])
                    outs.append(out)
                return x, jax.tree.map(lambda *a: jnp.stack(a), *outs)

            x, outs = jax.lax.scan(body, x, (jax.tree.map(group, stacked), None if keys is None else group(keys),
                                             group(rates), rel_groups))
            per_block, weights = jax.tree.map(lambda a: a.reshape(depth, *a.shape[2:]), outs)
        else:
            outs = []
            for i in range(depth):
                params = jax.tree.map(lambda a: a[i], stacked)
                x, out = make_block_fn(i)(x, params, None if keys is None else keys[i], rates[i], rel[i])
                outs.append(out)
            per_block, weights = jax.tree.map(lambda *a: jnp.stack(a), *outs) if outs else (None, None)
        return (x if self.norm is None else self.norm(x)), per_block, weights


class ViT(nnx.Module):
    """Vision Transformer; see ViTConfig for the options.

    Call: `logits, out = model(images, train=False, rng=None, capture=())` with images (B, H, W, 3) in [-1, 1].
    A `dense` backbone returns the (B, gh, gw, C) feature map (after the neck if any) in place of logits, and adds
    `tokens` (the (B, gh, gw, D) map before the neck) and `dense` (the returned map in the compute dtype) to `out`.
    `out` holds named intermediates: `pre_logits` (the features a linear probe / few-shot evaluator reads),
    `encoded` (all tokens after the final LayerNorm), and on request (`capture`) `blocks` (tokens after every block,
    (depth, B, T, D)) and `attention` (softmax weights, (depth, B, heads, T, T)).
    """

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        pd = jnp.dtype(cfg.param_dtype)
        kw = dict(param_dtype=pd, rngs=rngs)
        if cfg.resnet_layers:
            self.stem = ResNetStem(cfg.resnet_layers, cfg.resnet_width, **kw)
            cin = resnet_out_channels(cfg.resnet_layers, cfg.resnet_width)
        else:
            self.stem = None
            cin = 3
        self.embedding = L.PatchEmbed(cfg.patch_size, cin, cfg.width, **kw)
        self.cls = L.param(rngs, L.zeros, (1, 1, cfg.width), pd, (None, None, "embed")) if cfg.pool == "token" else None
        # DeiT's distillation token (random, as timm initialises it: two zero tokens would start out identical).
        self.dist = L.param(rngs, L.normal(0.02), (1, 1, cfg.width), pd, (None, None, "embed")) if cfg.distilled else None
        # Register tokens (Darcet et al. 2024), initialised as DINOv2 does (normal, std 1e-6).
        self.reg = (L.param(rngs, L.normal(1e-6), (1, cfg.registers, cfg.width), pd, (None, None, "embed"))
                    if cfg.registers else None)
        if cfg.posemb == "learn":  # rows for the class (and distillation) token and the patches; registers have none
            self.pos_embedding = L.param(rngs, L.normal(0.02), (1, cfg.num_prefix_tokens + cfg.num_patches,
                                                                 cfg.width), pd, (None, None, "embed"))
        else:
            self.pos_embedding = None
        self.encoder = Encoder(cfg, rngs=rngs)
        self.neck = L.Neck(cfg.width, cfg.neck_dim, **kw) if cfg.neck_dim else None
        self.map_head = (L.MAPHead(cfg.width, cfg.mlp_dim, cfg.num_heads, **kw) if cfg.pool == "map" else None)
        feat = cfg.width
        if cfg.rep_size:
            self.pre_logits = L.Linear(cfg.width, cfg.rep_size, ("embed", "mlp"), kernel_init=L.lecun_normal(1), **kw)
            feat = cfg.rep_size
        else:
            self.pre_logits = None
        if cfg.num_classes:
            # Zero-initialised head (ViT paper §3.2); bias -10 for sigmoid pretraining keeps the initial loss small.
            self.head = L.Linear(feat, cfg.num_classes, ("embed", "vocab"), kernel_init=L.zeros,
                                 bias_init=L.constant(cfg.head_bias_init), **kw)
        else:
            self.head = None
        self.head_dist = (L.Linear(feat, cfg.num_classes, ("embed", "vocab"), kernel_init=L.zeros, **kw)
                          if cfg.distilled else None)

    def embed(self, images: jax.Array) -> jax.Array:
        """Images -> patch tokens (B, N, D) (before class token and position embedding)."""
        cfg = self.cfg
        x = images.astype(jnp.dtype(cfg.dtype))
        if self.stem is not None:
            x = self.stem(x)
        grid = (x.shape[1] // cfg.patch_size[0], x.shape[2] // cfg.patch_size[1])
        if grid != cfg.grid:
            raise ValueError(f"input {images.shape[1:3]} gives a {grid[0]}x{grid[1]} patch grid but the model was "
                             f"built for {cfg.grid} (image_size={cfg.image_size}); resize the position embedding to "
                             "change the resolution")
        return self.embedding(x)

    def tokens(self, images: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """Images -> the encoder's input before dropout: patch tokens with their position embeddings (B, N, D), and
        the class token with its own (B, 1, D), or None without one. Kept apart so that MAE can drop patches."""
        return self.add_positions(self.embed(images))

    def add_positions(self, x: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """Patch embeddings (B, N, D) -> `tokens`' two parts (the second: class and distillation tokens, (B, 2, D),
        with DeiT's token; then the register tokens, which get no position). Apart so that masked patch prediction
        can corrupt the patch embeddings before their positions are added."""
        cfg = self.cfg
        dtype = x.dtype
        k = cfg.num_prefix_tokens
        if self.pos_embedding is not None:
            pe = self.pos_embedding[...].astype(dtype)
        else:
            pe = posemb_sincos_2d(*cfg.grid, cfg.width)
            if k:  # the class (and distillation) token get no position
                pe = np.concatenate([np.zeros((1, k, cfg.width), np.float32), pe], 1)
            pe = jnp.asarray(pe, dtype)
        if self.cls is None:
            return x + pe, None
        prefix = self.cls[...] if self.dist is None else jnp.concatenate([self.cls[...], self.dist[...]], 1)
        prefix = prefix.astype(dtype) + pe[:, :k]
        if self.reg is not None:
            prefix = jnp.concatenate([prefix, self.reg[...].astype(dtype)], 1)
        return x + pe[:, k:], jnp.broadcast_to(prefix, (x.shape[0], prefix.shape[1], cfg.width))

    def __call__(self, images: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
                 capture: tuple[str, ...] = ()) -> tuple[jax.Array, dict[str, Any]]:
        cfg = self.cfg
        needs_rng = train and (cfg.dropout or cfg.attention_dropout or cfg.drop_path)
        if needs_rng and rng is None:
            raise ValueError("train=True with dropout/drop-path needs an `rng` key")
        unknown = set(capture) - {"blocks", "attention"}
        if unknown:
            raise ValueError(f"unknown capture {sorted(unknown)}; use 'blocks' and/or 'attention'")
        k_embed, k_enc = jax.random.split(rng) if needs_rng else (None, None)

        patches, cls = self.tokens(images)
        x = patches if cls is None else jnp.concatenate([cls, patches], 1)
        x = L.dropout(x, cfg.dropout, k_embed)

        encoded, per_block, weights = self.encoder(x, key=k_enc, capture_blocks="blocks" in capture,
                                                   capture_attention="attention" in capture)
        if cfg.registers:  # registers only carry computation: the outputs are the class token's and the patches'
            encoded = jnp.concatenate([encoded[:, :cfg.num_prefix_tokens],
                                       encoded[:, cfg.num_prefix_tokens + cfg.registers:]], 1)
        out: dict[str, Any] = {"encoded": encoded}
        if "blocks" in capture:
            out["blocks"] = per_block
        if "attention" in capture:
            out["attention"] = weights
        if cfg.dense:
            return self._dense(encoded, out)
        if cfg.pool == "token":
            x = encoded[:, 0]
        elif cfg.pool == "gap":
            x = encoded.mean(axis=1)
        else:
            x = self.map_head(encoded, gelu_kind=cfg.gelu)
        if self.pre_logits is not None:
            x = jnp.tanh(self.pre_logits(x))
        out["pre_logits"] = x
        logits = self.head(x) if self.head is not None else x
        if self.head_dist is not None:  # DeiT: the class and distillation heads, averaged to predict
            out["cls_logits"] = logits.astype(jnp.float32)
            out["dist_logits"] = self.head_dist(encoded[:, 1]).astype(jnp.float32)
            logits = (out["cls_logits"] + out["dist_logits"]) / 2
        return logits.astype(jnp.float32), out


    def _dense(self, encoded: jax.Array, out: dict[str, Any]) -> tuple[jax.Array, dict[str, Any]]:
        """Backbone output: the (B, gh, gw, D) token map, through the neck when there is one."""
        tokens = encoded.reshape(encoded.shape[0], *self.cfg.grid, encoded.shape[-1])
        out["tokens"] = tokens
        out["pre_logits"] = encoded.mean(axis=1)  # one vector per image, for linear probes and few-shot
        features = self.neck(tokens) if self.neck is not None else tokens
        out["dense"] = features
        return features.astype(jnp.float32), out


def count_params(tree) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


class FunctionalViT:
    """The ViT as pure functions of a parameter pytree (a nested dict of arrays).

    This is the form that jit, sharding, optimizers and checkpoints handle: `init(rng) -> params`,
    `apply(params, images, **kw) -> (logits, out)`, plus the abstract `shapes` and the `logical_axes` of every
    parameter (for the mesh rules of vit_jax.parallel), both nested dicts with the same structure as params.
    """

    def __init__(self, cfg: ViTConfig, module: type[nnx.Module] = ViT):
        # `module`: the model family's NNX class (vit_jax.models.build.build_model picks it from the config's type)
        self.cfg = cfg
        self.module = module
        abstract = nnx.eval_shape(lambda: module(cfg, rngs=nnx.Rngs(0)))
        self.graphdef, state = nnx.split(abstract)
        self.shapes = nnx.to_pure_dict(state)
        self.logical_axes = _map_variables(state, lambda v: tuple(v.get_metadata()["logical_axes"]))

    def init(self, rng: jax.Array) -> dict[str, Any]:
        return nnx.to_pure_dict(nnx.state(self.module(self.cfg, rngs=nnx.Rngs(params=rng))))

    def apply(self, params: dict[str, Any], images: jax.Array, **kw) -> tuple[jax.Array, dict[str, Any]]:
        return nnx.merge(self.graphdef, params)(images, **kw)

    def num_params(self) -> int:
        return count_params(self.shapes)

    def bind(self, params: dict[str, Any]) -> nnx.Module:
        """The NNX module holding `params`, for its methods other than the forward pass (MAE's `reconstruct`)."""
        return nnx.merge(self.graphdef, params)


def _map_variables(state, fn):
    out = {}
    for k, v in state.items():
        out[k] = fn(v) if isinstance(v, nnx.Variable) else _map_variables(v, fn)
    return out
