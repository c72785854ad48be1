"""Model configuration: the ViT family as one frozen dataclass, and variant strings such as "B/16" or "R50+B/16"."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from vit_jax.errors import UserError

# Width, depth, MLP size and heads: ViT paper Table 1 (Ti/S/B/L/H) and Scaling ViT (Zhai et al. 2022) Table 2 (M/g/G).
SIZES: dict[str, dict[str, int]] = {
    "Ti": dict(width=192, depth=12, mlp_dim=768, num_heads=3),
    "S": dict(width=384, depth=12, mlp_dim=1536, num_heads=6),
    "M": dict(width=512, depth=12, mlp_dim=2048, num_heads=8),
    "B": dict(width=768, depth=12, mlp_dim=3072, num_heads=12),
    "L": dict(width=1024, depth=24, mlp_dim=4096, num_heads=16),
    "H": dict(width=1280, depth=32, mlp_dim=5120, num_heads=16),
    "g": dict(width=1408, depth=40, mlp_dim=6144, num_heads=16),
    "G": dict(width=1664, depth=48, mlp_dim=8192, num_heads=16),
}

# BiT ResNet stems of the hybrids (ViT paper §4.1), by effective patch size on the image. R50 for /16 keeps three
# stages (3, 4, 9): the 4th stage's units move into stage 3 so the stem downsamples by 16 and the Transformer sees 1x1
# patches; /32 hybrids keep four stages (stride 32). These are the layouts of the official checkpoints.
RESNET_STEMS: dict[str, dict[int, tuple[int, ...]]] = {
    "R50": {16: (3, 4, 9), 32: (3, 4, 6, 3)},
    "R26": {32: (2, 2, 2, 2)},
}

# The fields a variant string ("B/16", "R50x2+B/16") sets. Everything else keeps ViTConfig's default unless given.
VARIANT_FIELDS = ("width", "depth", "mlp_dim", "num_heads", "patch_size", "resnet_layers", "resnet_width")

POOLS = ("token", "gap", "map")
POSEMBS = ("learn", "sincos2d")
GELUS = ("tanh", "erf")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash", "cpu")  # models/attention_impl.py says what each is
FFNS = ("mlp", "swiglu")
POSEMB_RESIZES = ("bicubic", "dinov2")  # models/posemb_resize.py says how they differ


class ModelConfigError(UserError, ValueError):
    """A model setting (variant string, size, option) is not valid; the message names the valid choices."""


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Everything that defines a ViT's parameters and computation.

    Parameter shapes depend on `image_size` (the learned position embedding has one row per patch).
    """

    num_classes: int = 1000  # 0: no head; the model returns pre-logits features
    image_size: tuple[int, int] = (224, 224)
    patch_size: tuple[int, int] = (16, 16)
    width: int = 768
    depth: int = 12
    mlp_dim: int = 3072
    num_heads: int = 12
    pool: str = "token"  # token | gap | map
    posemb: str = "learn"  # learn | sincos2d
    rep_size: int = 0  # >0: pre-logits Dense+tanh layer of this size (ViT paper pretraining head)
    head_bias_init: float = 0.0  # -10 for sigmoid cross-entropy pretraining on ImageNet-21k (AugReg)
    dropout: float = 0.0
    attention_dropout: float = 0.0
    drop_path: float = 0.0  # stochastic depth rate of the last block; block i gets drop_path * i / (depth - 1)
    gelu: str = "tanh"  # the official code uses the tanh approximation; "erf" is the exact GELU
    dtype: str = "float32"  # compute dtype; parameters are always kept in param_dtype
    param_dtype: str = "float32"
    remat: str = "none"  # rematerialisation policy per block: none | full | dots | dots_no_batch
    scan: bool = False  # one compiled block scanned over depth (fast compile for deep models)
    # Which kernel softmax attention lowers to (models/attention_impl.py): a lowering choice, not a parameter.
    attention: str = "auto"
    # hybrid: units per BiT ResNet stage, e.g. (3, 4, 9) for R50; (0,): the root conv + max-pool alone (the official
    # R+ViT-Ti checkpoints: resnet.num_layers=(), 8x8 patches on the stride-4 root)
    resnet_layers: tuple[int, ...] = ()
    resnet_width: int = 1  # hybrid: width factor of the ResNet stem
    # High-resolution backbones (SAM / ViTDet): blocks attend inside window_size x window_size windows of the patch
    # grid (padded to a multiple of the window), except those in global_blocks; 0 = every block global.
    window_size: int = 0
    global_blocks: tuple[int, ...] = ()
    rel_pos: bool = False  # decomposed relative position bias (per block tables of 2*S-1 rows, S its attention size)
    # dense: a backbone without class token, final LayerNorm or head; the model returns the patch tokens as a
    # (B, gh, gw, D) map, or the neck's (B, gh, gw, neck_dim) map when neck_dim > 0 (SAM: 256).
    dense: bool = False
    neck_dim: int = 0
    # LayerNorm epsilon of the encoder (blocks and final norm): 1e-6 as the official ViT and SAM; timm's SAM port
    # builds its blocks with torch's default 1e-5, so its state dicts load with that.
    ln_eps: float = 1e-6
    # DeiT (Touvron et al. 2021): a distillation token after the class token ([cls, dist, patches], both with
    # position embeddings) with its own head `head_dist`; the model predicts with the two heads' average and
    # returns each head's logits in `out` (cls_logits, dist_logits) for the distillation objective.
    distilled: bool = False
    # DINOv2 (Oquab et al. 2023) options. LayerScale (CaiT): a per-channel gamma on each residual branch, initialised
    # to this value (DINOv2: 1e-5); 0 = none.
    layer_scale: float = 0.0
    # Register tokens (Darcet et al. 2024): learned tokens after the class token, without position embedding, dropped
    # from the outputs (`encoded` and the pooled features); DINOv2's reg4 models have 4.
    registers: int = 0
    # The block's feed-forward: "mlp" (Dense-GELU-Dense) or "swiglu" (DINOv2's ViT-g: w3(silu(x1) * x2) with
    # [x1; x2] = w12(x); mlp_dim is the hidden size of each half, 4096 for ViT-g).
    ffn: str = "mlp"
    # How the model itself resizes its learned position table to another grid while running (DINO's crops of other
    # sizes): "bicubic" (jax.image.resize, as timm's resample_abs_pos_embed) or "dinov2" (DINOv2's offset bicubic).
    posemb_resize: str = "bicubic"

    def __post_init__(self):
        def check(name, value, allowed):
            if value not in allowed:
                raise ModelConfigError(f"ViTConfig.{name}={value!r} is not one of {allowed}")

        check("pool", self.pool, POOLS)
        check("posemb", self.posemb, POSEMBS)
        check("gelu", self.gelu, GELUS)
        check("remat", self.remat, REMAT_POLICIES)
        check("dtype", self.dtype, DTYPES)
        check("param_dtype", self.param_dtype, DTYPES)
        check("attention", self.attention, ATTENTION_IMPLEMENTATIONS)
        check("ffn", self.ffn, FFNS)
        check("posemb_resize", self.posemb_resize, POSEMB_RESIZES)
        if 0 in self.resnet_layers and self.resnet_layers != (0,):
            raise ModelConfigError(
                f"resnet_layers={self.resnet_layers}: every stage needs units; (0,) is the root-only stem")
        if self.width % self.num_heads:
            raise ModelConfigError(f"width {self.width} is not divisible by num_heads {self.num_heads}")
        if self.posemb == "sincos2d" and self.width % 4:
            raise ModelConfigError(f"sincos2d position embeddings need width divisible by 4, got {self.width}")
        self._check_spatial()
        fh, fw = self.feature_grid_input
        if fh % self.patch_size[0] or fw % self.patch_size[1]:
            raise ModelConfigError(
                f"image size {self.image_size} (feature map {fh}x{fw} after the stem) is not divisible by patch "
                f"size {self.patch_size}")

    def _check_spatial(self) -> None:
        if self.window_size < 0:
            raise ModelConfigError(f"window_size={self.window_size}: use 0 (global attention) or a window in patches")
        bad = [i for i in self.global_blocks if not 0 <= i < self.depth]
        if bad or len(set(self.global_blocks)) != len(self.global_blocks):
            raise ModelConfigError(f"global_blocks={self.global_blocks}: give distinct block indices in "
                                   f"[0, {self.depth})")
        if self.global_blocks and not self.window_size:
            raise ModelConfigError("global_blocks is set but window_size=0 (every block is already global); "
                                   "set window_size")
        if (self.window_size or self.rel_pos) and self.pool == "token":
            raise ModelConfigError("window_size/rel_pos work on the patch grid, which has no class token: use "
                                   "pool='gap' or 'map', or dense=True")
        if self.dense and (self.num_classes or self.rep_size or self.pool != "gap"):
            raise ModelConfigError(f"dense=True is a backbone without head: needs num_classes=0, rep_size=0 and "
                                   f"pool='gap' (got {self.num_classes}, {self.rep_size}, {self.pool!r})")
        if not 0 < self.ln_eps < 1:
            raise ModelConfigError(f"ln_eps={self.ln_eps}: use a small positive epsilon such as 1e-6")
        if self.distilled and (self.pool != "token" or not self.num_classes or self.rep_size):
            raise ModelConfigError(f"distilled=True (DeiT's distillation token) needs pool='token', a head and no "
                                   f"pre-logits (got pool={self.pool!r}, num_classes={self.num_classes}, "
                                   f"rep_size={self.rep_size})")
        self._check_dinov2()
        if self.neck_dim < 0 or (self.neck_dim and not self.dense):
            raise ModelConfigError(f"neck_dim={self.neck_dim}: the neck exists only with dense=True and needs a "
                                   "positive channel count")

    def _check_dinov2(self) -> None:
        if not 0 <= self.layer_scale < 1:
            raise ModelConfigError(f"layer_scale={self.layer_scale}: give LayerScale's initial gamma (DINOv2: 1e-5), "
                                   "or 0 for none")
        if self.registers < 0:
            raise ModelConfigError(f"registers={self.registers}: give a number of register tokens (reg4: 4) or 0")
        if self.registers and (self.pool != "token" or self.distilled):
            raise ModelConfigError(f"registers={self.registers} sit after the class token: they need pool='token' "
                                   f"and no distillation token (got pool={self.pool!r}, distilled={self.distilled})")

    def is_global(self, block: int) -> bool:
        """Whether encoder block `block` attends over the whole grid (else inside windows)."""
        return not self.window_size or block in self.global_blocks

    def attention_size(self, block: int) -> tuple[int, int]:
        """The (rows, columns) of tokens one attention of block `block` sees: the grid, or one window."""
        return self.grid if self.is_global(block) else (self.window_size, self.window_size)

    @property
    def spatial_attention(self) -> bool:
        """Blocks attend on the 2D grid (windows and/or relative positions) rather than over a flat sequence."""
        return bool(self.window_size or self.rel_pos)

    @property
    def stem_stride(self) -> int:
        """Downsampling of the hybrid ResNet stem before the patch embedding (1 for a plain ViT)."""
        return stem_stride(self.resnet_layers)

    @property
    def feature_grid_input(self) -> tuple[int, int]:
        s = self.stem_stride
        if self.image_size[0] % s or self.image_size[1] % s:
            raise ModelConfigError(f"image size {self.image_size} is not divisible by the ResNet stem stride {s}")
        return self.image_size[0] // s, self.image_size[1] // s

    @property
    def grid(self) -> tuple[int, int]:
        """Patch grid (rows, columns) seen by the Transformer."""
        fh, fw = self.feature_grid_input
        return fh // self.patch_size[0], fw // self.patch_size[1]

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def seq_len(self) -> int:
        """Tokens the encoder attends over: the prefix tokens, register tokens and patches."""
        return self.num_patches + self.num_prefix_tokens + self.registers

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches that have a position-embedding row: the class token, and DeiT's distillation
        token after it (register tokens, after these, have none)."""
        return (1 + int(self.distilled)) if self.pool == "token" else 0

    @property
    def name(self) -> str:
        size = next((k for k, v in SIZES.items() if v == dict(width=self.width, depth=self.depth,
                                                              mlp_dim=self.mlp_dim, num_heads=self.num_heads)), None)
        size = size or f"w{self.width}d{self.depth}m{self.mlp_dim}h{self.num_heads}"
        stem = next((f"{k}+" for k, by_patch in RESNET_STEMS.items() if self.resnet_layers in by_patch.values()), "")
        if self.resnet_layers == (0,):
            stem = "R+"  # the root alone, as the official R+ViT-Ti
        elif self.resnet_layers and not stem:
            stem = "R" + "-".join(map(str, self.resnet_layers)) + "+"
        p = [x * self.stem_stride for x in self.patch_size]  # hybrids are named by their patch on the image
        patch = str(p[0]) if p[0] == p[1] else f"{p[0]}x{p[1]}"
        return f"{stem}ViT-{size}/{patch}"

    def replace(self, **kw: Any) -> "ViTConfig":
        return dataclasses.replace(self, **_normalise(kw))


def stem_stride(resnet_layers: tuple[int, ...]) -> int:
    """Downsampling of a BiT ResNet stem: root conv /2, max-pool /2, and /2 in every stage after the first."""
    if not resnet_layers:
        return 1
    return 4 * 2 ** (len(resnet_layers) - 1)


def _pair(v) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(x) for x in v)
    if len(v) != 2:
        raise ModelConfigError(f"expected an int or a pair, got {v}")
    return v


def _normalise(kw: dict[str, Any]) -> dict[str, Any]:
    kw = dict(kw)
    for k in ("image_size", "patch_size"):
        if k in kw:
            kw[k] = _pair(kw[k])
    for k in ("resnet_layers", "global_blocks"):
        if k in kw:
            kw[k] = tuple(int(x) for x in (kw[k] or ()))
    if kw.get("rep_size") is None and "rep_size" in kw:
        kw["rep_size"] = 0
    if kw.get("num_classes") is None and "num_classes" in kw:
        kw["num_classes"] = 0
    return kw


_VARIANT_RE = re.compile(r"^(?:(?P<stem>R\d+)(?:x(?P<wf>\d+))?\+)?(?:ViT-)?(?P<size>Ti|S|M|B|L|H|g|G)(?:/(?P<patch>\d+))?$")


def parse_variant(variant: str) -> dict[str, Any]:
    """"B/16" -> width/depth/mlp/heads/patch; "R50+B/16" adds the hybrid stem (patch counted on the feature map)."""
    m = _VARIANT_RE.match(variant.strip())
    if not m:
        raise ModelConfigError(f"unknown ViT variant {variant!r}: expected e.g. 'Ti/16', 'B/32', 'H/14', 'R50+B/16' "
                         f"(sizes {', '.join(SIZES)}; stems {', '.join(RESNET_STEMS)})")
    out: dict[str, Any] = dict(SIZES[m["size"]])
    if m["stem"]:
        if m["stem"] not in RESNET_STEMS:
            raise ModelConfigError(
                f"unknown ResNet stem {m['stem']!r} in {variant!r}; known: {', '.join(RESNET_STEMS)}")
        by_patch = RESNET_STEMS[m["stem"]]
        patch = int(m["patch"] or min(by_patch))
        if patch not in by_patch:
            raise ModelConfigError(f"{variant}: the {m['stem']} stem exists for patch sizes {sorted(by_patch)}")
        # Hybrids are named by their effective patch on the image; the stem already downsamples by that much, so the
        # Transformer sees 1x1 patches of the feature map.
        out["resnet_layers"] = by_patch[patch]
        out["resnet_width"] = int(m["wf"] or 1)
        out["patch_size"] = (patch // stem_stride(by_patch[patch]),) * 2
    elif m["patch"]:
        out["patch_size"] = (int(m["patch"]),) * 2
    return out


def vit_config(variant: str | None = None, **overrides: Any) -> ViTConfig:
    """Builds a ViTConfig from a variant string plus keyword overrides (custom sizes by keyword)."""
    kw = parse_variant(variant) if variant else {}
    if overrides.get("dense"):  # a backbone: no head and no class token unless asked (and then refused, clearly)
        kw.update(num_classes=0, pool="gap")
    kw.update(overrides)
    return ViTConfig(**_normalise(kw))
