"""The ViT family's checkpoint formats on the registry (checkpoints/formats.py): official / big_vision .npz and timm
.safetensors (SAM-style backbones included) to read, and `vit-jax convert`'s exporter with its surgery (new
resolution, new head, pre-logits dropped)."""

from __future__ import annotations

from typing import Any

import jax

from vit_jax.checkpoints import formats
from vit_jax.checkpoints.layouts import LAYOUTS
from vit_jax.checkpoints.npz import load_npz_params, save_npz_params
from vit_jax.checkpoints.surgery import adapt_params
from vit_jax.checkpoints.timm import load_timm, save_timm
from vit_jax.models.config import ViTConfig
from vit_jax.models.vit import FunctionalViT


def export(cfg: ViTConfig, params: dict[str, Any], dst: str,
           request: formats.ExportRequest) -> tuple[ViTConfig, list[str], str]:
    if cfg.distilled and request.to != "timm":  # the .npz layouts have no distillation token or second head
        raise formats.ExportError(f"{cfg.name} has DeiT's distillation token (model.distilled), which the "
                                  f"{request.to} .npz layout cannot hold: export it with --to timm (timm's "
                                  "deit_*_distilled_* layout)")
    dinov2 = [f for f, on in (("layer_scale", cfg.layer_scale), ("registers", cfg.registers),
                              ("ffn='swiglu'", cfg.ffn == "swiglu")) if on]
    if dinov2 and request.to != "timm":  # the .npz layouts have no LayerScale, register or SwiGLU arrays
        raise formats.ExportError(f"{cfg.name} uses DINOv2's model.{', model.'.join(dinov2)}, which the {request.to} "
                                  ".npz layout cannot hold: export it with --to timm (timm's vit_*_dinov2 layout)")
    changes: dict[str, Any] = {}
    if request.image_size:
        changes["image_size"] = request.image_size
    if request.num_classes is not None:
        changes["num_classes"] = request.num_classes
    if request.drop_pre_logits:
        changes["rep_size"] = 0
    notes: list[str] = []
    if changes:
        target = cfg.replace(**changes)
        init = FunctionalViT(target).init(jax.random.key(0))
        reinit = ("head",) if "num_classes" in changes or "rep_size" in changes else ()
        params, notes = adapt_params(params, cfg, init, target, reinit=reinit, posemb_method=request.posemb_method)
        cfg = target
    if request.to == "timm":
        try:
            save_timm(dst, params, cfg)  # refuses what timm cannot express before writing anything
        except ValueError as e:
            raise formats.ExportError(str(e)) from e
    else:
        save_npz_params(dst, params, cfg, layout=request.to)
    return cfg, notes, f"{request.to} layout"


def is_vit_npz_file(path: str) -> bool:
    """Whether an .npz holds a ViT (official, big_vision or a train checkpoint's wrapper around one): a patch
    embedding, from the archive's names only. An archive that cannot be listed is left to the one-line description
    of an unrecognised file (formats.describe_unrecognised), which reads it and names what is wrong."""
    import zipfile

    from etils import epath

    try:
        with epath.Path(path).open("rb") as f:
            return any(n.endswith("embedding/kernel.npy") for n in zipfile.ZipFile(f).namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def is_vit_timm_file(path: str) -> bool:
    """Whether a .safetensors file holds a timm VisionTransformer (SAM-style included): a patch embedding and an
    absolute position embedding (timm's Swin has the first, not the second). Reads the header only."""
    from safetensors import safe_open

    with safe_open(path, "np") as f:
        keys = set(f.keys())
    return {"patch_embed.proj.weight", "pos_embed"} <= keys


formats.register_reader(formats.Reader(
    family="ViT", suffix=".npz", recognise=is_vit_npz_file, load=load_npz_params,
    reads="official/big_vision .npz", signature=("embedding/kernel", "cls", "Transformer/encoder_norm/scale",
                                                 "Transformer/posembed_input/pos_embedding", "head/kernel")))
formats.register_reader(formats.Reader(
    family="ViT", suffix=".safetensors", recognise=is_vit_timm_file, load=lambda path, **_: load_timm(path),
    reads="timm .safetensors", signature=("patch_embed.proj.weight", "pos_embed", "cls_token",
                                          "blocks.0.attn.qkv.weight", "norm.weight", "head.weight")))
formats.register_exporter(formats.Exporter(family="ViT", targets=(*LAYOUTS, "timm"), export=export))
