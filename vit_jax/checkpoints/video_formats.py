"""The video family's checkpoints: transformers' ViViT (`VivitModel` / `VivitForVideoClassification` saved with
`save_pretrained`: model.safetensors beside its config.json) read into our layout, and the inflation of an image ViT
into a video ViT (ViViT §3.4: the 2D patch kernel becomes a 3D tubelet kernel, the position embedding repeats in time).

transformers' layout (5.x): `embeddings.{cls_token, position_embeddings, patch_embeddings.projection.{weight,bias}}`
(a Conv3d, weight (D, 3, t, p, p)), `layers.{i}.{layernorm_before, attention.{q,k,v,o}_proj, layernorm_after,
mlp.fc1, mlp.fc2}` (torch Linear: weight (out, in)), `layernorm`, and `pooler.dense` (a dense+tanh we do not have) or,
in the classifier, everything under `vivit.` plus `classifier`. Files (save_pretrained, the Hub's google/vivit-*) keep
the 4.x names, which the reader also takes: `encoder.layer.{i}.{attention.attention.{query,key,value},
attention.output.dense, intermediate.dense, output.dense}`. Only the joint encoder (ViViT's Model 1) exists there.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from vit_jax.checkpoints import formats
from vit_jax.checkpoints.layouts import CheckpointReadError
from vit_jax.models.config import ViTConfig
from vit_jax.models.video_config import VideoConfig

# transformers' activation names -> our GELU kinds ("gelu_fast" and "gelu_new" are the tanh approximation).
HF_GELU = {"gelu_fast": "tanh", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "erf"}
EMBED = "embeddings.patch_embeddings.projection.weight"


def video_config_from_hf(hf: Mapping[str, Any], num_classes: int = 0) -> VideoConfig:
    """The VideoConfig of a transformers VivitConfig (its to_dict() or config.json)."""
    act = hf.get("hidden_act", "gelu_fast")
    if act not in HF_GELU:
        raise CheckpointReadError(f"ViViT hidden_act={act!r} is not a GELU vit-jax has ({', '.join(HF_GELU)})")
    if not hf.get("qkv_bias", True):
        raise CheckpointReadError("ViViT qkv_bias=False: vit-jax's attention always has query/key/value biases")
    size = hf.get("image_size", 224)
    t, ph, pw = hf.get("tubelet_size", (2, 16, 16))
    return VideoConfig(num_classes=num_classes, num_frames=int(hf.get("num_frames", 32)),
                       image_size=(size, size) if isinstance(size, int) else tuple(size), patch_size=(ph, pw),
                       tubelet=t, width=hf["hidden_size"], depth=hf["num_hidden_layers"],
                       mlp_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"], encoder="joint",
                       pool="token", gelu=HF_GELU[act], ln_eps=float(hf.get("layer_norm_eps", 1e-6)))


def from_vivit(sd: Mapping[str, np.ndarray], cfg: VideoConfig) -> dict[str, Any]:
    """Our parameters from a transformers ViViT state dict (numpy arrays) of the model `cfg` describes."""
    prefix = "vivit." if f"vivit.{EMBED}" in sd else ""

    def get(name):
        key = prefix + name
        return np.asarray(sd[key] if key in sd else sd[prefix + _legacy_name(name)])
    d, h = cfg.width, cfg.num_heads
    hd = d // h

    def heads(name):  # a (D, D) torch Linear -> our (D, heads, head_dim) kernel and (heads, head_dim) bias
        return {"kernel": get(f"{name}.weight").T.reshape(d, h, hd), "bias": get(f"{name}.bias").reshape(h, hd)}

    def linear(name):
        return {"kernel": get(f"{name}.weight").T, "bias": get(f"{name}.bias")}

    def norm(name):
        return {"scale": get(f"{name}.weight"), "bias": get(f"{name}.bias")}

    blocks = []
    for i in range(cfg.depth):
        a = f"layers.{i}.attention"
        blocks.append({
            "ln1": norm(f"layers.{i}.layernorm_before"), "ln2": norm(f"layers.{i}.layernorm_after"),
            "attn": {"query": heads(f"{a}.q_proj"), "key": heads(f"{a}.k_proj"), "value": heads(f"{a}.v_proj"),
                     "out": {"kernel": get(f"{a}.o_proj.weight").T.reshape(h, hd, d), "bias": get(f"{a}.o_proj.bias")}},
            "mlp": {"fc1": linear(f"layers.{i}.mlp.fc1"), "fc2": linear(f"layers.{i}.mlp.fc2")},
        })
    stacked = _stack(blocks)
    params = {
        "embedding": {"kernel": get(EMBED).transpose(2, 3, 4, 1, 0),  # (D, 3, t, p, p) -> (t, p, p, 3, D)
                      "bias": get("embeddings.patch_embeddings.projection.bias")},
        "cls": get("embeddings.cls_token"), "pos_embedding": get("embeddings.position_embeddings"),
        "encoder": {"blocks": stacked, "norm": norm("layernorm")},
    }
    if cfg.num_classes:
        params["head"] = {"kernel": np.asarray(sd["classifier.weight"]).T, "bias": np.asarray(sd["classifier.bias"])}
    return params


# 5.x module names -> the 4.x names its files are written with (the conversion transformers applies on loading).
_LEGACY = {"attention.q_proj": "attention.attention.query", "attention.k_proj": "attention.attention.key",
           "attention.v_proj": "attention.attention.value", "attention.o_proj": "attention.output.dense",
           "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}


def _legacy_name(name: str) -> str:
    if not name.startswith("layers."):
        return name
    _, i, rest = name.split(".", 2)
    module, _, leaf = rest.rpartition(".")
    return f"encoder.layer.{i}.{_LEGACY.get(module, module)}.{leaf}"


def _stack(trees: list[dict[str, Any]]) -> dict[str, Any]:
    if isinstance(trees[0], dict):
        return {k: _stack([t[k] for t in trees]) for k in trees[0]}
    return np.stack(trees)


def is_vivit_file(path: str) -> bool:
    """Whether a .safetensors file holds a transformers ViViT (a 5-D tubelet projection); the header only."""
    from safetensors import safe_open

    with safe_open(path, "np") as f:
        keys = set(f.keys())
    return EMBED in keys or f"vivit.{EMBED}" in keys


def load_vivit(path: str, **_: Any) -> tuple[VideoConfig, dict[str, Any]]:
    """A transformers ViViT saved with save_pretrained: its model.safetensors, with config.json beside it (the
    number of heads, frames and resolution are not in the arrays)."""
    from safetensors.numpy import load_file

    config = os.path.join(os.path.dirname(path), "config.json")
    if not os.path.exists(config):
        raise CheckpointReadError(f"{path} is a transformers ViViT state dict without its config.json beside it "
                                  "(heads, frames and resolution are recorded there): save it with save_pretrained")
    with open(config) as f:
        hf = json.load(f)
    sd = load_file(path)
    num_classes = sd["classifier.weight"].shape[0] if "classifier.weight" in sd else 0
    cfg = video_config_from_hf(hf, num_classes)
    return cfg, from_vivit(sd, cfg)


class InflationError(CheckpointReadError):
    """An image ViT that cannot become the requested video ViT (another size, patch or pooling)."""


INFLATIONS = ("central", "average")


def inflate_image_vit(image_cfg: ViTConfig, image_params: Mapping[str, Any], video_cfg: VideoConfig,
                      video_init: Mapping[str, Any], method: str = "central") -> dict[str, Any]:
    """A video ViT's parameters from an image ViT's (scenic's model_utils init_embedding / init_posemb, written
    anew): the (p, p, 3, D) patch kernel becomes a (t, p, p, 3, D) tubelet kernel, either at the central frame t//2
    with zeros elsewhere ("central") or repeated and divided by t ("average"), so that a clip of identical frames
    embeds as the image; the spatial position embedding repeats over the nt time steps (joint encoder) or is the
    spatial encoder's as is (factorised). With global-average pooling the joint model then predicts a still clip
    exactly as the image (every token repeats nt times, which softmax attention and the mean do not see); a class
    token, which does not repeat, gets a smaller share of attention, so there it is close, not equal. The encoder
    blocks, class token and (same-sized) head are copied; what the image has no counterpart of (the temporal
    encoder, a head of another size) comes from `video_init`."""
    if method not in INFLATIONS:
        raise InflationError(f"inflation {method!r} is not one of {INFLATIONS}")
    same = ("width", "depth", "mlp_dim", "num_heads", "patch_size", "pool", "gelu")
    differ = [f"{k} {getattr(image_cfg, k)} vs {getattr(video_cfg, k)}" for k in same
              if getattr(image_cfg, k) != getattr(video_cfg, k)]
    if differ or image_cfg.resnet_layers or image_cfg.distilled or image_cfg.posemb != "learn":
        raise InflationError(f"{image_cfg.name} cannot inflate into {video_cfg.name}: "
                             + ("; ".join(differ) or "a plain ViT with learned position embeddings is needed"))
    if tuple(image_cfg.grid) != tuple(video_cfg.grid[1:]):
        raise InflationError(f"{image_cfg.name} has a {image_cfg.grid} patch grid, the video model "
                             f"{video_cfg.grid[1:]}: resize the image checkpoint first (vit-jax convert --image-size "
                             f"{video_cfg.image_size[0]})")
    kernel = np.asarray(image_params["embedding"]["kernel"])
    t = video_cfg.tubelet
    if method == "central":
        tubelet = np.zeros((t, *kernel.shape), kernel.dtype)
        tubelet[t // 2] = kernel
    else:
        tubelet = np.repeat(kernel[None], t, axis=0) / t
    pos = np.asarray(image_params["pos_embedding"])
    cls = 1 if video_cfg.pool == "token" else 0
    if video_cfg.encoder == "joint":
        nt = video_cfg.grid[0]
        pos = np.concatenate([pos[:, :cls], np.tile(pos[:, cls:], (1, nt, 1))], axis=1)
    params = {k: v for k, v in video_init.items()}
    params.update(embedding={"kernel": tubelet, "bias": np.asarray(image_params["embedding"]["bias"])},
                  pos_embedding=pos, encoder=image_params["encoder"])
    if cls:
        params["cls"] = image_params["cls"]
    if video_cfg.num_classes and "head" in image_params and \
            np.shape(image_params["head"]["kernel"]) == np.shape(video_init["head"]["kernel"]):
        params["head"] = image_params["head"]
    return params


formats.register_reader(formats.Reader(
    family="Video", suffix=".safetensors", recognise=is_vivit_file, load=load_vivit,
    reads="transformers ViViT .safetensors + config.json",
    signature=(EMBED, "embeddings.position_embeddings", "layers.0.attention.q_proj.weight", "layernorm.weight")))


def _inflate(image_cfg: ViTConfig, image_params: dict[str, Any], video_cfg: VideoConfig,
             video_init: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """init.checkpoint of an image ViT for a video model: central-frame inflation, scenic's Kinetics default."""
    params = inflate_image_vit(image_cfg, image_params, video_cfg, video_init, "central")
    nt = video_cfg.grid[0]
    posemb = f"repeated over {nt} time steps" if video_cfg.encoder == "joint" else "the spatial encoder's"
    return params, [f"inflated the patch kernel to {video_cfg.tubelet} frames (central frame), position embedding "
                    f"{posemb}"]


formats.register_converter(formats.Converter(source="ViT", target="Video", convert=_inflate))
