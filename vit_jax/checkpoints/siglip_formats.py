"""big_vision's SigLIP / two-tower `.npz` layout on the checkpoint registry (checkpoints/formats.py).

The layout (big_vision `models/proj/image_text/two_towers.py`, optionally under `params/`):
- `img/...`: the image ViT in big_vision's ViT layout (checkpoints/layouts.py), its `img/head` the projection to the
  shared embedding (ours: `img_proj`); a file without one is big_vision's `out_dim=None` image tower (open_clip's
  and Hugging Face's SigLIP have none either): its representation is the embedding (ours: `image_proj=False`), and
  it is written back without;
- `txt/Embed_0/embedding` (V, D), `txt/pos_embedding` (1, L, D), `txt/Encoder_0/encoderblock_{i}/...` (the ViT block
  names; `encoderblock/...` with a leading layer axis when scanned), `txt/Encoder_0/encoder_norm`, `txt/MAPHead_0`
  (MAP pooling only), `txt/head` (the text projection);
- `t` (log temperature) and `b` (bias), shape (1,).

The layout records no text pooling or attention mask: big_vision's SigLIP text tower is bidirectional and pooled at
the last token (or by MAP, whose head is in the file), so a causal, EOS-pooled (CLIP) text tower is refused on export.
big_vision computes the tanh form of GELU, which is what a file read here gets; a tower trained with the exact (erf)
GELU is written with a note that the file computes differently.

`load_any` of such a file gives its image tower (LiT, fine-tuning, predict); `load_siglip_npz` gives both towers.
open_clip's big_vision loader and Hugging Face's SigLIP read no `img/head`: a file with one gives them other image
embeddings (the export says so).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import zipfile
from typing import Any

import numpy as np

from vit_jax.checkpoints import formats
from vit_jax.checkpoints.layouts import (_BLOCK_NAMES, _MAP_NAMES, CheckpointMismatchError, CheckpointReadError,
                                         _leaves_of, check_against, flatten, from_layout, infer_config, save_npz,
                                         to_layout, unflatten)
from vit_jax.errors import one_line
from vit_jax.models.config import ViTConfig
from vit_jax.models.text import ImageText, TextConfig

TARGET = "siglip"  # vit-jax convert --to siglip
FAMILY = "ImageText"
BV = 1  # big_vision's names in layouts._BLOCK_NAMES


@dataclasses.dataclass(frozen=True)
class ImageTextSpec:
    """The architecture of a two-tower checkpoint: the image ViT, the text tower and the shared embedding size."""

    image: ViTConfig
    text: TextConfig
    embed_dim: int
    image_proj: bool = True  # False: no `img/head` (big_vision's out_dim=None): embed_dim is the image width

    @property
    def name(self) -> str:
        t = self.text
        return (f"{self.image.name} + text tower {t.depth}x{t.width} ({t.max_len} tokens, vocabulary {t.vocab_size}), "
                f"embedding {self.embed_dim}{'' if self.image_proj else ' (no image projection)'}")

    def model(self):
        """The two towers as a FunctionalViT (`shapes`, `bind`), image tower included."""
        from vit_jax.models.vit import FunctionalViT

        return FunctionalViT(self.image, functools.partial(ImageText, text=self.text, embed_dim=self.embed_dim,
                                                           image_proj=self.image_proj))

    def shapes(self) -> dict[str, Any]:
        """The parameters' abstract shapes (traced once per architecture: reading and writing both check them)."""
        return _shapes(self)


@functools.lru_cache(maxsize=8)
def _shapes(spec: ImageTextSpec) -> dict[str, Any]:
    return spec.model().shapes


# ---------------------------------------------------------------------------------------------------------------------
# Ours <-> big_vision names.

def to_siglip_layout(params: dict[str, Any], spec: ImageTextSpec) -> dict[str, np.ndarray]:
    """Our two-tower parameters (`img`, `img_proj`, `txt`, `t`, `b`) -> big_vision's flat names."""
    flat = {k: np.asarray(v) for k, v in flatten(params).items()}
    check_against(flat, flatten(spec.shapes()), f"parameters vs {spec.name}")
    img = {k[len("img/"):]: v for k, v in flat.items() if k.startswith("img/")}
    out = {f"img/{k}": v for k, v in to_layout(img, spec.image, "big_vision").items()}
    if spec.image_proj:
        out["img/head/kernel"], out["img/head/bias"] = flat["img_proj/kernel"], flat["img_proj/bias"]
    txt = {k[len("txt/"):]: v for k, v in flat.items() if k.startswith("txt/")}
    out["txt/Embed_0/embedding"] = txt.pop("embedding")
    out["txt/pos_embedding"] = txt.pop("pos_embedding")
    for k, v in txt.items():
        out[f"txt/{_text_name(k)}"] = v
    out["t"], out["b"] = flat["t"], flat["b"]
    return out


def _text_name(ours: str) -> str:
    """`block_3/attn/query/kernel` -> `Encoder_0/encoderblock_3/MultiHeadDotProductAttention_0/query/kernel`."""
    if m := re.fullmatch(r"block_(\d+)/(.+)", ours):
        sub = m.group(2)
        part = next(p for p in _BLOCK_NAMES if sub.startswith(p + "/"))
        return f"Encoder_0/encoderblock_{m.group(1)}/{_BLOCK_NAMES[part][BV]}{sub[len(part):]}"
    if ours.startswith("norm/"):
        return f"Encoder_0/encoder_norm/{ours[len('norm/'):]}"
    if ours.startswith("map_head/"):
        sub = ours[len("map_head/"):]
        part = next(p for p in _MAP_NAMES if sub == p or sub.startswith(p + "/"))
        return f"MAPHead_0/{_MAP_NAMES[part]}{sub[len(part):]}"
    return ours  # head/kernel, head/bias


def _unstack_scanned(txt: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A scanned text encoder (`Encoder_0/encoderblock/...`, leading layer axis) -> numbered blocks."""
    scanned = {k: v for k, v in txt.items() if k.startswith("Encoder_0/encoderblock/")}
    out = {k: v for k, v in txt.items() if k not in scanned}
    for k, v in scanned.items():
        for i, layer in enumerate(v):
            out[k.replace("encoderblock/", f"encoderblock_{i}/", 1)] = layer
    return out


def infer_text_config(txt: dict[str, np.ndarray]) -> tuple[TextConfig, int]:
    """(text tower, embedding size) from big_vision's `txt/...` arrays (without the `txt/` prefix)."""
    need = ("Embed_0/embedding", "pos_embedding", "head/kernel",
            "Encoder_0/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel")
    missing = [f"txt/{k}" for k in need if k not in txt]
    if missing:
        raise CheckpointMismatchError(f"not a two-tower text tower: missing {', '.join(missing)}")
    vocab, width = txt["Embed_0/embedding"].shape
    depth = len({m.group(1) for k in txt if (m := re.match(r"Encoder_0/encoderblock_(\d+)/", k))})
    heads = txt["Encoder_0/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"].shape[1]
    text = TextConfig(vocab_size=vocab, max_len=txt["pos_embedding"].shape[1], width=width, depth=depth,
                      num_heads=heads, mlp_dim=txt["Encoder_0/encoderblock_0/MlpBlock_0/Dense_0/kernel"].shape[1],
                      pool="map" if any(k.startswith("MAPHead_0/") for k in txt) else "last", gelu="tanh")
    return text, txt["head/kernel"].shape[1]


def from_siglip_layout(flat: dict[str, np.ndarray], **infer_kw: Any) -> tuple[ImageTextSpec, dict[str, Any]]:
    """big_vision's flat names (no `params/` prefix) -> (the architecture, our nested parameters)."""
    img = {k[len("img/"):]: v for k, v in flat.items() if k.startswith("img/")}
    txt = _unstack_scanned({k[len("txt/"):]: v for k, v in flat.items() if k.startswith("txt/")})
    if "t" not in flat or "b" not in flat:
        raise CheckpointMismatchError("not a two-tower checkpoint: it has no t (temperature) and b (bias)")
    # big_vision's image tower without an output dimension (out_dim None) has no head: its representation is the
    # embedding.
    proj = {"kernel": img.pop("head/kernel"), "bias": img.pop("head/bias")} if "head/kernel" in img else None
    image = infer_config(img, **infer_kw)  # headless: the projection is ours `img_proj`
    text, embed_dim = infer_text_config(txt)
    if proj is None and embed_dim != (image.rep_size or image.width):
        raise CheckpointMismatchError(f"no img/head, so the image features are the embedding, but they are "
                                      f"{image.rep_size or image.width} wide and txt/head gives {embed_dim}")
    ours = {f"img/{k}": v for k, v in from_layout(img, image).items()}
    ours.update({"t": flat["t"], "b": flat["b"]})
    if proj is not None:
        ours.update({"img_proj/kernel": proj["kernel"], "img_proj/bias": proj["bias"]})
    spec = ImageTextSpec(image, text, embed_dim, image_proj=proj is not None)
    shapes = spec.shapes()
    names = {_text_name(k): k for k in flatten(shapes["txt"])}
    names.update({"Embed_0/embedding": "embedding", "pos_embedding": "pos_embedding"})
    unexpected = sorted(f"txt/{k}" for k in txt if k not in names)
    if unexpected:
        raise CheckpointMismatchError(f"text tower arrays this layout does not have: {', '.join(unexpected[:4])}")
    ours.update({f"txt/{names[k]}": v for k, v in txt.items()})
    check_against(ours, flatten(shapes), f"two-tower checkpoint vs {spec.name}")
    return spec, unflatten(ours)


# ---------------------------------------------------------------------------------------------------------------------
# Files.

def _read(path: str) -> dict[str, np.ndarray]:
    """The file's arrays with big_vision's optional `params/` prefix removed (optimizer state beside it ignored)."""
    from etils import epath

    try:
        with epath.Path(path).open("rb") as f, np.load(f, allow_pickle=False) as z:
            flat = {k: np.asarray(z[k]) for k in z.files}
    except ValueError as e:
        raise CheckpointReadError(f"{path} is not a readable .npz of arrays ({one_line(e)})") from e
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointReadError(f"{path} is not a readable .npz of arrays ({one_line(e)}); is it truncated?") from e
    inside = {k[len("params/"):]: v for k, v in flat.items() if k.startswith("params/")}
    return inside if "img/embedding/kernel" in inside else flat


def load_siglip_npz(path: str, **infer_kw: Any) -> tuple[ImageTextSpec, dict[str, Any]]:
    """Both towers of a big_vision SigLIP-layout .npz: (architecture, our nested parameters)."""
    return from_siglip_layout(_read(path), **infer_kw)


def save_siglip_npz(path: str, params: dict[str, Any], spec: ImageTextSpec) -> None:
    save_npz(path, to_siglip_layout(params, spec))


def is_siglip_npz_file(path: str) -> bool:
    """Whether an .npz holds two towers: an image patch embedding under `img/` and a text embedding under `txt/`
    (optionally under `params/`), from the archive's names only."""
    from etils import epath

    try:
        with epath.Path(path).open("rb") as f:
            names = set(zipfile.ZipFile(f).namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return any({f"{p}img/embedding/kernel.npy", f"{p}txt/Embed_0/embedding.npy"} <= names for p in ("", "params/"))


def load_image_tower(path: str, **infer_kw: Any) -> tuple[ViTConfig, dict[str, Any]]:
    """`load_any`'s reading of a two-tower file: its image tower, without the projection (what LiT locks)."""
    spec, params = load_siglip_npz(path, **infer_kw)
    print(f"{path}: read the image tower of {spec.name}; the text tower is read by `vit-jax predict` and "
          "`vit-jax convert --to siglip`")
    return spec.image, params["img"]


def export(spec: ImageTextSpec, params: dict[str, Any], dst: str,
           request: formats.ExportRequest) -> tuple[ImageTextSpec, list[str], str]:
    """`vit-jax convert --to siglip`: both towers as they are (no surgery) in big_vision's layout."""
    if request.image_size or request.num_classes is not None or request.drop_pre_logits:
        raise formats.ExportError("--to siglip writes the two towers as they are: --image-size, --num-classes and "
                                  "--drop-pre-logits are for single-tower checkpoints")
    if not isinstance(spec, ImageTextSpec):
        raise formats.ExportError("--to siglip needs a two-tower checkpoint (a siglip/clip run or a SigLIP .npz)")
    if spec.text.causal or spec.text.pool == "eos":
        raise formats.ExportError("big_vision's SigLIP layout holds a bidirectional text tower pooled at the last "
                                  "token or by MAP; this text tower is causal / pooled at the end-of-text token (CLIP)")
    notes = []
    exact = [name for name, gelu in (("image", spec.image.gelu), ("text", spec.text.gelu)) if gelu != "tanh"]
    if exact:
        notes.append(f"the {' and '.join(exact)} tower used the exact (erf) GELU; big_vision (and this file read "
                     "back) computes the tanh form: embeddings differ by about 1e-3")
    if spec.image_proj:
        notes.append("open_clip's big_vision loader and Hugging Face's SigLIP read no img/head (the image projection): "
                     "their image embeddings leave it out (train with image_proj=False for a file they read exactly)")
    save_siglip_npz(dst, params, spec)
    return spec, notes, "big_vision SigLIP layout"


# Registered before the ViT family's .npz reader (checkpoints/loading.py imports this module first), which would
# otherwise take a two-tower file for a ViT by its `embedding/kernel`.
formats.register_reader(formats.Reader(
    family=FAMILY, suffix=".npz", recognise=is_siglip_npz_file, load=load_image_tower,
    reads="big_vision SigLIP .npz", signature=("img/embedding/kernel", "txt/Embed_0/embedding", "t", "b")))
formats.register_exporter(formats.Exporter(family=FAMILY, targets=(TARGET,), export=export))
