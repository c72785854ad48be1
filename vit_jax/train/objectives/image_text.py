"""`siglip` and `clip`: image-text contrastive pretraining of two towers (models/text.py), and LiT.

The model is `ImageText`: our ViT (`model.*`, usually `pool='map'` as SigLIP) + a text Transformer (`<group>.text_*`)
+ projections + the learned temperature `t` and bias `b`, all the objective's parameters. The batch carries `image`
and `tokens` (int32 ids: the `tokenize` op of data/text_ops.py). Losses (models/contrastive.py) are over the global
batch: `clip` the softmax loss, `siglip` the sigmoid loss passing text embeddings device to device (`chunked`, the
paper's memory-light form) or all-gathered.

Micro-batching is refused: the train step calls the loss once per micro-batch, so each would see only its own
negatives, a different objective from the configured batch's. The memory a large contrastive batch needs is kept
down instead by the chunked loss (no device holds more than its own block of logits) and by `model.remat`.

LiT (`lock_image`: a checkpoint any reader of `load_any` opens: ours, big_vision/official .npz, timm) locks the image
tower: its parameters are the objective's extra state (never updated, saved with the run), the model then holds only
`img_proj`, `txt`, `t`, `b`.

The evaluator (`zeroshot` for siglip, `clip_zeroshot` for clip): zero-shot top-1 with prompts (class names x
templates, each class's embeddings averaged and renormalised; `zeroshot_classes='digits'`: the digits with the
held-out templates of data/text_ops.py, never seen in training) and image<->text retrieval recall@1/5/10 over the
eval split's pairs (a pair counts as found at k when fewer than k texts score strictly higher than its own, so
identical captions of other images do not count against it).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.errors import ConfigError, UserError
from vit_jax.models.build import model_flops
from vit_jax.models.config import ModelConfigError
from vit_jax.models.contrastive import batch_axes_of, sigmoid_loss_sharded, softmax_loss
from vit_jax.models.flops import Flops
from vit_jax.models.sharding_hints import current_resolver
from vit_jax.models.text import ImageText, TextConfig
from vit_jax.models.vit import FunctionalViT
from vit_jax.train.objectives.base import EvalReport, Objective, needs_rng
from vit_jax.train.objectives.registry import register

ZEROSHOT_SETS = ("", "digits")
RECALL_AT = (1, 5, 10)


@dataclasses.dataclass(frozen=True)
class SigLIPSettings:
    """Text tower, embedding and loss settings. Defaults: SigLIP B/16 (big_vision: text 12 x 768, 64 tokens, 32k
    vocabulary, bidirectional with last-token pooling; t = log 10, b = -10)."""

    embed_dim: int = 768
    text_vocab_size: int = 32_000
    text_max_len: int = 64
    text_width: int = 768
    text_depth: int = 12
    text_heads: int = 12
    text_mlp_dim: int = 3072
    text_pool: str = "last"
    text_causal: bool = False
    text_eos_id: int = 1
    t_init: float = math.log(10.0)
    b_init: float = -10.0
    # False: no image projection, the image tower's representation is the embedding (embed_dim = its width), as
    # big_vision's SigLIP (image out_dim=None); open_clip's and Hugging Face's SigLIP read such a file exactly.
    image_proj: bool = True
    chunked: bool = True  # sigmoid loss: texts passed round the devices (False: all-gathered)
    tokenizer: str = "digits"  # the zero-shot prompts' SentencePiece model: a path, or 'digits' (the demo's own)
    pad_id: int = 0
    zeroshot_classes: str = "digits"  # the prompts' classes and templates ('' = retrieval only)
    lock_image: str = ""  # LiT: the image tower's checkpoint, locked

    def __post_init__(self):
        self.text()  # validates the text tower's settings
        if self.embed_dim <= 0:
            raise ModelConfigError(f"embed_dim={self.embed_dim}: give the shared embedding size (> 0)")
        if self.zeroshot_classes not in ZEROSHOT_SETS:
            raise ModelConfigError(f"zeroshot_classes='{self.zeroshot_classes}': choose one of "
                                   f"{', '.join(map(repr, ZEROSHOT_SETS))}")

    def text(self) -> TextConfig:
        return TextConfig(vocab_size=self.text_vocab_size, max_len=self.text_max_len, width=self.text_width,
                          depth=self.text_depth, num_heads=self.text_heads, mlp_dim=self.text_mlp_dim,
                          pool=self.text_pool, causal=self.text_causal, eos_id=self.text_eos_id)


@dataclasses.dataclass(frozen=True)
class CLIPSettings(SigLIPSettings):
    """CLIP's text tower (causal, pooled at the end-of-text token) and temperature init 1/0.07; `b` is unused."""

    embed_dim: int = 512
    text_vocab_size: int = 49_408
    text_max_len: int = 77
    text_width: int = 512
    text_heads: int = 8
    text_mlp_dim: int = 2048
    text_pool: str = "eos"
    text_causal: bool = True
    text_eos_id: int = 49_407
    t_init: float = math.log(1 / 0.07)
    b_init: float = 0.0


def text_flops(text: TextConfig, embed_dim: int) -> float:
    """Forward FLOPs of one text: the blocks' matmuls, attention over max_len tokens, and the head."""
    t, w = text.max_len, text.width
    per_layer = 2 * t * (4 * w * w + 2 * w * text.mlp_dim) + 4 * t * t * w
    return float(text.depth * per_layer + 2 * w * embed_dim)


@register
class SigLIP(Objective):
    name = "siglip"
    evaluator = "zeroshot"
    settings, settings_type = "siglip", SigLIPSettings
    uses_labels = False
    pretraining = True
    loss_kind = "sigmoid"

    def __init__(self, model_cfg, settings: SigLIPSettings):
        self.s = settings
        # The text tower computes in the image tower's dtype and rematerialises its blocks the same way (model.*).
        self.text_cfg = dataclasses.replace(settings.text(), dtype=model_cfg.dtype, remat=model_cfg.remat)
        locked = bool(settings.lock_image)
        self.model = FunctionalViT(model_cfg, functools.partial(
            ImageText, text=self.text_cfg, embed_dim=settings.embed_dim, lock_image=locked,
            image_proj=settings.image_proj, t_init=settings.t_init, b_init=settings.b_init))
        self.image_model = FunctionalViT(model_cfg)  # the image tower alone (LiT's locked copy)
        self.needs_rng = needs_rng(model_cfg)
        image = model_flops(model_cfg).forward
        text = text_flops(self.text_cfg, settings.embed_dim)
        self.flops = Flops(forward=text + (0.0 if locked else image), breakdown={"image": image, "text": text},
                           frozen_forward=image if locked else 0.0)

    @classmethod
    def from_config(cls, config, model_cfg):
        return cls(model_cfg, cls.settings_of(config))

    @classmethod
    def check(cls, config):
        cls.settings_of(config)
        if config.micro_batches != 1:
            raise ConfigError(f"objective '{cls.name}' contrasts every pair of the global batch; micro_batches="
                              f"{config.micro_batches} would limit the negatives to each slice: set it to 1 (memory: "
                              "the chunked loss and model.remat)")

    @classmethod
    def keep_with_run(cls, config, run_dir, write):
        """The text tower's tokenizer (`<group>.tokenizer`; the demo's or a path) is the run's: copied into the
        workdir at the first start, used from there (data/text_ops.py keep_tokenizer_with_run). Reading a run
        (not `write`), `run_dir` may be its checkpoints/ folder or one step's."""
        from vit_jax.data.text_ops import keep_tokenizer_with_run

        return keep_tokenizer_with_run(cls.settings_of(config).tokenizer, run_dir if write else run_dir_of(run_dir),
                                       write)

    def batch_spec(self, batch_size):
        h, w = self.model.cfg.image_size
        return {"image": ((batch_size, h, w, 3), jnp.float32),
                "tokens": ((batch_size, self.text_cfg.max_len), jnp.int32)}

    # --- LiT: the locked image tower ---------------------------------------------------------------------------
    def init_extra(self, key):
        if not self.s.lock_image:
            return None
        from vit_jax.checkpoints.loading import load_any

        _, params = load_any(self.s.lock_image)
        # The tower is the representation: a classifier checkpoint's own head (official, timm) is not part of it.
        params = {k: v for k, v in params.items() if k != "head"}
        want = jax.tree.map(lambda a: tuple(a.shape), self.image_model.shapes)
        got = jax.tree.map(lambda a: tuple(np.shape(a)), params)
        if want != got:
            raise UserError(f"the locked image tower {self.s.lock_image} does not have the shapes model.* describes: "
                            "set model.* to that checkpoint's architecture (its classification head is dropped)")
        return {"img": jax.tree.map(lambda a: jnp.asarray(a, jnp.dtype(self.model.cfg.param_dtype)), params)}

    def extra_logical_axes(self):
        return {"img": self.image_model.logical_axes} if self.s.lock_image else None

    # --- embeddings and loss -------------------------------------------------------------------------------------
    def embed(self, params, extra, images, tokens, rng=None):
        """(zimg, ztxt, temperature, bias) of a batch; `rng` (training) drives the image tower's dropout."""
        model = self.model.bind(params)
        tower = None
        if self.s.lock_image:
            tower = self.image_model.bind(jax.tree.map(jax.lax.stop_gradient, extra["img"]))
        kw = dict(train=True, rng=rng) if rng is not None else {}
        zimg = model.embed_image(images, tower, **kw)
        ztxt = model.embed_text(tokens)
        t, b = model.scalars()
        return zimg, ztxt, t, b

    def inputs(self, batch, key):
        self.check_batch(batch)
        return {"image": batch["image"], "tokens": batch["tokens"].astype(jnp.int32)}

    def contrastive_loss(self, zimg, ztxt, t, b):
        resolver = current_resolver()
        if resolver is None:
            return sigmoid_loss_sharded(zimg, ztxt, t, b, mesh=None, batch_axes=())
        sharding = resolver(("batch", None), zimg.shape)
        return sigmoid_loss_sharded(zimg, ztxt, t, b, mesh=sharding.mesh, batch_axes=batch_axes_of(sharding.spec),
                                    chunked=self.s.chunked)

    def loss(self, params, inputs, key, extra=None):
        zimg, ztxt, t, b = self.embed(params, extra, inputs["image"], inputs["tokens"],
                                      key if self.needs_rng else None)
        return self.contrastive_loss(zimg, ztxt, t, b)

    # --- evaluation ---------------------------------------------------------------------------------------------
    def prompt_tokens(self) -> np.ndarray | None:
        """(classes, templates, max_len) ids of the zero-shot prompts, or None without zero-shot."""
        if not self.s.zeroshot_classes:
            return None
        from vit_jax.data.text_ops import digit_prompts, load_tokenizer

        prompts = digit_prompts()
        tokenizer = load_tokenizer(self.s.tokenizer, self.s.pad_id)
        ids = tokenizer([p for per_class in prompts for p in per_class], self.text_cfg.max_len)
        if ids.max() >= self.text_cfg.vocab_size:
            raise ConfigError(f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} ids, more than the text "
                              f"tower's {self.settings}.text_vocab_size={self.text_cfg.vocab_size}")
        return ids.reshape(len(prompts), -1, self.text_cfg.max_len)

    def eval_step(self):
        prompts = self.prompt_tokens()

        def eval_step(view, batch):
            params, extra = view if self.s.lock_image else (view, None)
            zimg, ztxt, _, _ = self.embed(params, extra, batch["image"], batch["tokens"].astype(jnp.int32))
            out = {"zimg": zimg, "ztxt": ztxt, "mask": batch["_mask"]}
            if "label" in batch:  # zero-shot needs class labels; an image-text dataset of captions alone has none
                out["label"] = batch["label"]
            if prompts is not None and "label" in batch:
                c, k, n = prompts.shape
                per_prompt = self.model.bind(params).embed_text(jnp.asarray(prompts.reshape(c * k, n)))
                classes = per_prompt.reshape(c, k, -1).mean(1)
                classes = classes / jnp.linalg.norm(classes, axis=-1, keepdims=True)
                out["zeroshot_pred"] = jnp.argmax(zimg @ classes.T, axis=-1)
            return out

        return eval_step

    def evaluate(self, eval_step, params, batches):
        parts = [jax.device_get(eval_step(params, batch)) for batch in batches]
        if not parts:
            raise ValueError("the evaluation split is empty")
        rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        keep = rows.pop("mask").astype(bool)
        rows = {k: v[keep] for k, v in rows.items()}
        result = {"count": float(keep.sum())}
        if "zeroshot_pred" in rows:
            result["zeroshot_top1"] = float(np.mean(rows["zeroshot_pred"] == rows["label"]))
        result.update(retrieval_recalls(rows["zimg"].astype(np.float64), rows["ztxt"].astype(np.float64)))
        return result

    def report(self, result, config):
        metrics = {f"eval/{k}": v for k, v in result.items()}
        zs = "zeroshot_top1" in result
        line = " | ".join([*([f"zero-shot top1 {100 * result['zeroshot_top1']:.2f}%"] if zs else []),
                           f"i->t R@1/5/10 " + "/".join(f"{100 * result[f'i2t_recall@{k}']:.1f}" for k in RECALL_AT),
                           f"t->i R@1/5/10 " + "/".join(f"{100 * result[f't2i_recall@{k}']:.1f}" for k in RECALL_AT),
                           f"{int(result['count'])} examples"])
        return EvalReport(metrics, "eval/zeroshot_top1" if zs else "eval/i2t_recall@1", True, line)


def retrieval_recalls(zimg: np.ndarray, ztxt: np.ndarray) -> dict[str, float]:
    """Image->text and text->image recall@k of n pairs (row i of each matches): the fraction of queries whose own
    match has fewer than k candidates scoring strictly higher."""
    sims = zimg @ ztxt.T
    own = np.diag(sims)
    i2t_rank = (sims > own[:, None]).sum(1)  # texts above each image's own caption
    t2i_rank = (sims > own[None, :]).sum(0)  # images above each caption's own image
    out = {}
    for k in RECALL_AT:
        out[f"i2t_recall@{k}"] = float(np.mean(i2t_rank < k))
        out[f"t2i_recall@{k}"] = float(np.mean(t2i_rank < k))
    return out


@register
class CLIP(SigLIP):
    name = "clip"
    evaluator = "clip_zeroshot"
    settings, settings_type = "clip", CLIPSettings
    loss_kind = "softmax"

    def contrastive_loss(self, zimg, ztxt, t, b):
        return softmax_loss(zimg, ztxt, t)


def load_image_text(path: str):
    """Both towers of a two-tower checkpoint as (checkpoints/siglip_formats.py `ImageTextSpec`, our nested params), or
    None when `path` is another kind of checkpoint: a `siglip`/`clip` run (LiT's locked image tower taken from the
    run's extra state) or a big_vision SigLIP-layout .npz. What `vit-jax convert --to siglip` and `predict` read."""
    import ml_collections
    from etils import epath

    from vit_jax.checkpoints import siglip_formats
    from vit_jax.checkpoints.loading import check_exists
    from vit_jax.checkpoints.training import load_run_metadata, load_state_from_run, model_config_from_meta

    check_exists(path)
    if str(path).endswith(".npz"):
        return siglip_formats.load_siglip_npz(path) if siglip_formats.is_siglip_npz_file(path) else None
    if not epath.Path(path).is_dir():
        return None
    meta = load_run_metadata(path)
    recorded = meta.get("config", {})
    kind = {"siglip": SigLIP, "clip": CLIP}.get(recorded.get("objective"))
    if kind is None:
        return None
    cfg = model_config_from_meta(meta)
    kind.keep_with_run(ml_collections.ConfigDict(recorded), path, write=False)  # the run's tokenizer
    objective = kind.from_config(ml_collections.ConfigDict(recorded), cfg)
    # LiT: the locked tower is the run's extra state, restored by its shapes (init_extra would read the original file).
    locked = {"extra": {"img": objective.image_model.shapes}} if objective.s.lock_image else {}
    _, state = load_state_from_run(path, {"params": objective.model.shapes, **locked})
    params = {**state["params"], **({"img": state["extra"]["img"]} if locked else {})}
    return siglip_formats.ImageTextSpec(cfg, objective.text_cfg, objective.s.embed_dim, objective.s.image_proj), params


def run_dir_of(path: str) -> str:
    """The run's workdir (where its own files are kept) of WORKDIR, WORKDIR/checkpoints or WORKDIR/checkpoints/<step>:
    the nearest of those holding the run's tokenizer copy, else `path` (a run from before copies were kept)."""
    from etils import epath

    from vit_jax.data.text_ops import RUN_TOKENIZER

    p = epath.Path(path)
    for root in (p, p.parent, p.parent.parent):
        if (root / RUN_TOKENIZER).exists():
            return str(root)
    return str(p)
