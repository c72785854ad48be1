"""timm's tensor layouts shared by its ViT and SAM-ViT state dicts: conv/linear transposes and the encoder blocks.

PyTorch: Linear weight (out, in), Conv2d weight (out, in, kh, kw); ours: (in, out) and (kh, kw, in, out). Blocks are
`blocks.{i}.norm1/attn.qkv/attn.proj/norm2/mlp.fc1/mlp.fc2.*` there and stacked `encoder/blocks/*` here; DINOv2's
options add `blocks.{i}.ls1.gamma`/`ls2.gamma` (LayerScale, ours `ls1/gamma`) and, for SwiGLU, timm's packed
`mlp.fc1` of (2 * mlp, embed) rows [gate; value] (SwiGLUPacked: silu of the first half times the second; ours
`mlp/gate` and `mlp/value`).
"""

from __future__ import annotations

import numpy as np

from vit_jax.models.config import ViTConfig


def linear_to_torch(kernel: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(kernel.reshape(kernel.shape[0], -1).T) if kernel.ndim == 2 else kernel


def conv_to_torch(kernel: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))  # (kh, kw, in, out) -> (out, in, kh, kw)


def conv_from_torch(weight: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(weight.transpose(2, 3, 1, 0))


def blocks_to_timm(p: dict[str, np.ndarray], cfg: ViTConfig) -> dict[str, np.ndarray]:
    """Our stacked encoder blocks (flat keys) -> timm's `blocks.{i}.*` (shared by ViT and SAM-ViT layouts)."""
    b, d, out = "encoder/blocks", cfg.width, {}
    for i in range(cfg.depth):
        t = f"blocks.{i}"
        out[f"{t}.norm1.weight"], out[f"{t}.norm1.bias"] = p[f"{b}/ln1/scale"][i], p[f"{b}/ln1/bias"][i]
        out[f"{t}.attn.qkv.weight"] = np.concatenate(
            [p[f"{b}/attn/{n}/kernel"][i].reshape(d, d).T for n in ("query", "key", "value")])
        out[f"{t}.attn.qkv.bias"] = np.concatenate([p[f"{b}/attn/{n}/bias"][i].reshape(d) for n in
                                                   ("query", "key", "value")])
        out[f"{t}.attn.proj.weight"] = np.ascontiguousarray(p[f"{b}/attn/out/kernel"][i].reshape(d, d).T)
        out[f"{t}.attn.proj.bias"] = p[f"{b}/attn/out/bias"][i]
        out[f"{t}.norm2.weight"], out[f"{t}.norm2.bias"] = p[f"{b}/ln2/scale"][i], p[f"{b}/ln2/bias"][i]
        fc1 = ("gate", "value") if cfg.ffn == "swiglu" else ("fc1",)
        out[f"{t}.mlp.fc1.weight"] = np.concatenate([linear_to_torch(p[f"{b}/mlp/{n}/kernel"][i]) for n in fc1])
        out[f"{t}.mlp.fc1.bias"] = np.concatenate([p[f"{b}/mlp/{n}/bias"][i] for n in fc1])
        out[f"{t}.mlp.fc2.weight"] = linear_to_torch(p[f"{b}/mlp/fc2/kernel"][i])
        out[f"{t}.mlp.fc2.bias"] = p[f"{b}/mlp/fc2/bias"][i]
        for ls in ("ls1", "ls2") if cfg.layer_scale else ():
            out[f"{t}.{ls}.gamma"] = p[f"{b}/{ls}/gamma"][i]
    return out


def blocks_from_timm(pop, cfg: ViTConfig) -> dict[str, np.ndarray]:
    """timm's `blocks.{i}.*`, taken with `pop(key)`, -> our stacked `encoder/blocks/*` (inverse of blocks_to_timm)."""
    d, h = cfg.width, cfg.num_heads
    k = d // h
    per_block: dict[str, list] = {}

    def add(key, value):
        per_block.setdefault(key, []).append(value)

    for i in range(cfg.depth):
        t = f"blocks.{i}"
        add("ln1/scale", pop(f"{t}.norm1.weight"))
        add("ln1/bias", pop(f"{t}.norm1.bias"))
        qkv_w = pop(f"{t}.attn.qkv.weight")
        qkv_b = pop(f"{t}.attn.qkv.bias")
        for j, n in enumerate(("query", "key", "value")):
            add(f"attn/{n}/kernel", qkv_w[j * d:(j + 1) * d].T.reshape(d, h, k))
            add(f"attn/{n}/bias", qkv_b[j * d:(j + 1) * d].reshape(h, k))
        add("attn/out/kernel", pop(f"{t}.attn.proj.weight").T.reshape(h, k, d))
        add("attn/out/bias", pop(f"{t}.attn.proj.bias"))
        add("ln2/scale", pop(f"{t}.norm2.weight"))
        add("ln2/bias", pop(f"{t}.norm2.bias"))
        fc1_w, fc1_b = pop(f"{t}.mlp.fc1.weight"), pop(f"{t}.mlp.fc1.bias")
        if cfg.ffn == "swiglu":  # timm's packed rows: [gate; value]
            m = cfg.mlp_dim
            add("mlp/gate/kernel", fc1_w[:m].T), add("mlp/gate/bias", fc1_b[:m])
            add("mlp/value/kernel", fc1_w[m:].T), add("mlp/value/bias", fc1_b[m:])
        else:
            add("mlp/fc1/kernel", fc1_w.T), add("mlp/fc1/bias", fc1_b)
        add("mlp/fc2/kernel", pop(f"{t}.mlp.fc2.weight").T)
        add("mlp/fc2/bias", pop(f"{t}.mlp.fc2.bias"))
        for ls in ("ls1", "ls2") if cfg.layer_scale else ():
            add(f"{ls}/gamma", pop(f"{t}.{ls}.gamma"))
    return {f"encoder/blocks/{key}": np.stack(values) for key, values in per_block.items()}
