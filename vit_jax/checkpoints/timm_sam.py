"""timm's `VisionTransformerSAM` state dict (e.g. `samvit_base_patch16`, SAM's image encoder) <-> our dense ViT.

timm key names and layouts beyond the plain ViT ones of vit_jax.checkpoints.timm: `pos_embed` is NHWC
(1, gh, gw, D); every block may hold `attn.rel_pos_h` / `attn.rel_pos_w` (2*S-1, head_dim) for its attention size S
(the window, or the whole grid for a global block); the neck is `neck.0` (1x1 conv, no bias), `neck.1` (LayerNorm2d),
`neck.2` (3x3 conv, no bias), `neck.3` (LayerNorm2d). There is no class token and no final norm.

Without our metadata the architecture is read from the tensors: head dimension and window size from the rel_pos
table sizes, global blocks from the blocks whose tables span the full grid, the neck from `neck.*`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from vit_jax.checkpoints.layouts import CheckpointMismatchError, check_against, flatten, unflatten
from vit_jax.checkpoints.timm_blocks import blocks_from_timm, blocks_to_timm, conv_from_torch, conv_to_torch
from vit_jax.models.config import ViTConfig

NECK = (("neck.1", "neck/ln1"), ("neck.3", "neck/ln2"))


def is_sam_state_dict(sd: dict[str, np.ndarray]) -> bool:
    """timm's SAM layout: relative position tables, a neck, or a (1, gh, gw, D) position embedding."""
    return ("neck.0.weight" in sd or "blocks.0.attn.rel_pos_h" in sd
            or ("pos_embed" in sd and np.ndim(sd["pos_embed"]) == 4))


def check_sam_compatible(cfg: ViTConfig) -> None:
    """Raises ValueError (one line, with the fix) for a model timm's VisionTransformerSAM cannot express."""
    if not cfg.dense or cfg.resnet_layers or cfg.posemb != "learn":
        raise ValueError(f"timm's SAM layout holds dense backbones with learned position embeddings and no ResNet "
                         f"stem; {cfg.name} (dense={cfg.dense}, posemb={cfg.posemb!r}) is not one")
    if cfg.window_size and not cfg.rel_pos:
        raise ValueError("a windowed model without rel_pos cannot be told apart from a global one in timm's layout; "
                         "export it with rel_pos=True or keep our checkpoint format")


def to_timm_sam(params: dict[str, Any], cfg: ViTConfig) -> dict[str, np.ndarray]:
    """Our parameters -> timm VisionTransformerSAM state dict (numpy arrays)."""
    check_sam_compatible(cfg)
    p = {k: np.asarray(v) for k, v in flatten(params).items()}
    out = {"patch_embed.proj.weight": conv_to_torch(p["embedding/kernel"]),
           "patch_embed.proj.bias": p["embedding/bias"],
           "pos_embed": p["pos_embedding"].reshape(1, *cfg.grid, cfg.width)}
    out.update(blocks_to_timm(p, cfg))
    for i in range(cfg.depth if cfg.rel_pos else 0):
        out[f"blocks.{i}.attn.rel_pos_h"] = p[f"encoder/rel_pos_{i}/h"]
        out[f"blocks.{i}.attn.rel_pos_w"] = p[f"encoder/rel_pos_{i}/w"]
    if cfg.neck_dim:
        out["neck.0.weight"], out["neck.2.weight"] = conv_to_torch(p["neck/conv1"]), conv_to_torch(p["neck/conv2"])
        for t, ours in NECK:
            out[f"{t}.weight"], out[f"{t}.bias"] = p[f"{ours}/scale"], p[f"{ours}/bias"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def from_timm_sam(sd: dict[str, np.ndarray], cfg: ViTConfig) -> dict[str, Any]:
    """timm VisionTransformerSAM state dict -> our parameters (exact inverse of `to_timm_sam`)."""
    check_sam_compatible(cfg)
    sd = dict(sd)

    def pop(key):
        if key not in sd:
            raise CheckpointMismatchError(f"timm SAM state dict lacks '{key}' needed by {cfg.name}")
        return np.asarray(sd.pop(key))

    p = {"embedding/kernel": conv_from_torch(pop("patch_embed.proj.weight")),
         "embedding/bias": pop("patch_embed.proj.bias")}
    pos = pop("pos_embed")
    p["pos_embedding"] = pos.reshape(1, -1, pos.shape[-1])
    p.update(blocks_from_timm(pop, cfg))
    for i in range(cfg.depth if cfg.rel_pos else 0):
        p[f"encoder/rel_pos_{i}/h"] = pop(f"blocks.{i}.attn.rel_pos_h")
        p[f"encoder/rel_pos_{i}/w"] = pop(f"blocks.{i}.attn.rel_pos_w")
    if cfg.neck_dim:
        p["neck/conv1"], p["neck/conv2"] = conv_from_torch(pop("neck.0.weight")), conv_from_torch(pop("neck.2.weight"))
        for t, ours in NECK:
            p[f"{ours}/scale"], p[f"{ours}/bias"] = pop(f"{t}.weight"), pop(f"{t}.bias")
    if any(k.startswith("head.") for k in sd):
        raise CheckpointMismatchError("the timm SAM state dict has a classification head (head.*), which a dense "
                                      "backbone does not hold: save the timm model built with num_classes=0")
    if sd:
        raise CheckpointMismatchError(f"timm SAM state dict has keys {cfg.name} does not use: {sorted(sd)[:8]}")
    p = {k: np.ascontiguousarray(v) for k, v in p.items()}
    from vit_jax.checkpoints.npz import expected_flat_shapes

    check_against(p, expected_flat_shapes(cfg), f"timm SAM state dict vs {cfg.name}")
    return unflatten(p)


def infer_sam_config(sd: dict[str, np.ndarray]) -> ViTConfig:
    """The architecture of a timm VisionTransformerSAM state dict, from its tensors alone."""
    from vit_jax.models.config import SIZES, vit_config

    width, _, ph, pw = sd["patch_embed.proj.weight"].shape
    if np.ndim(sd.get("pos_embed")) != 4:
        raise CheckpointMismatchError("timm SAM state dict without a (1, gh, gw, D) pos_embed: pass a config")
    gh, gw = sd["pos_embed"].shape[1:3]
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    rel_pos = "blocks.0.attn.rel_pos_h" in sd
    window, global_blocks = 0, []
    if rel_pos:
        heads = width // sd["blocks.0.attn.rel_pos_h"].shape[1]
        for i in range(depth):
            sh, sw = ((sd[f"blocks.{i}.attn.rel_pos_{a}"].shape[0] + 1) // 2 for a in "hw")
            if (sh, sw) == (gh, gw):
                global_blocks.append(i)
            elif sh == sw and window in (0, sh):
                window = sh
            else:
                raise CheckpointMismatchError(f"block {i}'s rel_pos tables ({sh}x{sw}) fit neither the {gh}x{gw} "
                                              f"grid nor one square window{f' of {window}' if window else ''}")
    else:  # no tables to read windows from: SAM models always have them; take the blocks as global
        heads = next((s["num_heads"] for s in SIZES.values() if s["width"] == width), max(width // 64, 1))
    if not window:
        global_blocks = []
    neck = sd["neck.0.weight"].shape[0] if "neck.0.weight" in sd else 0
    # timm builds SAM's blocks with nn.GELU (the exact, erf GELU) and nn.LayerNorm (eps 1e-5; SAM itself uses 1e-6).
    return vit_config(width=width, depth=depth, mlp_dim=sd["blocks.0.mlp.fc1.weight"].shape[0], num_heads=heads,
                      patch_size=(ph, pw), ln_eps=1e-5, image_size=(gh * ph, gw * pw), window_size=window,
                      global_blocks=tuple(global_blocks), rel_pos=rel_pos, dense=True, neck_dim=neck, gelu="erf")


def timm_sam_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    """`timm.models.vision_transformer_sam.VisionTransformerSAM(**kwargs)` computing the same function.

    timm's blocks normalise with eps 1e-5; a model with another `ln_eps` (SAM's own 1e-6) also needs
    `norm_layer=partial(nn.LayerNorm, eps=ln_eps)`, which JSON cannot hold: the metadata's `layernorm_eps` says it.
    """
    assert cfg.image_size[0] == cfg.image_size[1] and cfg.patch_size[0] == cfg.patch_size[1], "timm: square only"
    return dict(img_size=cfg.image_size[0], patch_size=cfg.patch_size[0], embed_dim=cfg.width, depth=cfg.depth,
                num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.width, use_rel_pos=cfg.rel_pos,
                window_size=cfg.window_size, global_attn_indexes=list(cfg.global_blocks), neck_chans=cfg.neck_dim,
                num_classes=0, **({"act_layer": "gelu_tanh"} if cfg.gelu == "tanh" else {}))


def save_timm_sam(path: str, params: dict[str, Any], cfg: ViTConfig) -> None:
    from safetensors.numpy import save_file

    fields = ("image_size", "patch_size", "width", "depth", "mlp_dim", "num_heads", "gelu", "window_size",
              "global_blocks", "rel_pos", "dense", "neck_dim", "ln_eps")
    meta = {"format": "pt", "timm_kwargs": json.dumps(timm_sam_kwargs(cfg)), "layernorm_eps": repr(cfg.ln_eps),
            "vit_jax_config": json.dumps({f: getattr(cfg, f) for f in fields})}
    save_file(to_timm_sam(params, cfg), path, metadata=meta)


def load_timm_sam(sd: dict[str, np.ndarray], meta: dict[str, str],
                  cfg: ViTConfig | None = None) -> tuple[ViTConfig, dict[str, Any]]:
    """A timm SAM state dict (already read) -> (config, params); the config from our metadata, else the tensors."""
    from vit_jax.models.config import vit_config

    if cfg is None:
        cfg = vit_config(**json.loads(meta["vit_jax_config"])) if "vit_jax_config" in meta else infer_sam_config(sd)
    return cfg, from_timm_sam(sd, cfg)
