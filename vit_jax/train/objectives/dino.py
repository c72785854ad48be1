"""`dino`: self-distillation without labels, DINO / iBOT / DINOv2 (settings `dino.*`; defaults DINOv2's ViT-S/B/L
recipe, configs/ssl_default_config.yaml, except the prototypes' count, which small runs set).

The student (the objective's model, models/dino.py: ViT + DINO head + mask token) learns to match an EMA teacher
(the extra state: the student's copy at step 0, then teacher <- m * teacher + (1 - m) * student after every applied
step, m following a cosine from `momentum_start` to `momentum_end` over the run). Per example, the batch's one image
becomes 2 global crops (the model's image size) and `local_crops` local ones (`local_crop_size`) on the devices
(data/multicrop.py: DINO's augmentations, drawn per row from the step's key, so resume is exact and the crops do not
depend on the process count). The teacher sees the global crops; the student all crops, its global crops with iBOT's
block masks on a share `ibot_mask_probability` of them.

Loss = dino_weight * DINO (class tokens, every teacher/other-crop pair) + ibot_weight * iBOT (masked patch tokens of
the global crops) + koleo_weight * KoLeo (student class tokens per global crop); the teacher's targets are centred
softmaxes (EMA centres with momentum `center_momentum`, of the class and of the patch logits, state updated from
the loss's aux) or Sinkhorn-Knopp (`centering='sinkhorn_knopp'`), at a temperature warming up linearly from
`teacher_temp_start` to `teacher_temp` over the first `teacher_temp_warmup` of the run.

Its evaluator `dino` reports the DINO loss of the final teacher on two fixed crops of each eval image (the same crops
every evaluation) and the teacher's mean entropy over prototypes (a collapse shows as ~0 or ~log K); few-shot linear
probes and k-NN read the encoder's class token (`pre_logits`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from vit_jax.data.multicrop import CropSpec, ibot_masks, multi_crop
from vit_jax.errors import ConfigError
from vit_jax.models.build import model_flops
from vit_jax.models.dino import DinoHeadConfig, DinoViT
from vit_jax.models.dino_losses import centered_softmax, dino_loss, ibot_loss, koleo, sinkhorn_knopp
from vit_jax.models.flops import Flops
from vit_jax.models.vit import FunctionalViT
from vit_jax.train.objectives.base import EvalReport, Objective, needs_rng
from vit_jax.train.objectives.registry import register

CENTERINGS = ("centering", "sinkhorn_knopp")
EVAL_CROP_KEY = 0


@dataclasses.dataclass(frozen=True)
class DinoConfig:
    """The `dino.*` settings (the module docstring says what each does)."""

    head_hidden: int = 2048
    head_bottleneck: int = 256
    prototypes: int = 65_536
    head_layers: int = 3
    separate_ibot_head: bool = False  # DINOv2: shared for S/B/L, separate for g
    student_temp: float = 0.1
    teacher_temp: float = 0.07
    teacher_temp_start: float = 0.04
    teacher_temp_warmup: float = 0.3  # fraction of the run (DINOv2: 30 of 100 epochs)
    freeze_prototypes: float = 0.0  # fraction of the run the prototypes stay fixed (DINO: 1 of 100 epochs)
    momentum_start: float = 0.992  # 0.994 for g
    momentum_end: float = 1.0
    centering: str = "centering"  # centering | sinkhorn_knopp
    center_momentum: float = 0.9
    sinkhorn_iterations: int = 3
    local_crops: int = 8
    local_crop_size: int = 96  # 98 for g/14
    global_scale_min: float = 0.32
    global_scale_max: float = 1.0
    local_scale_min: float = 0.05
    local_scale_max: float = 0.32
    augment: bool = True  # colour jitter, grayscale, blur, solarisation (False: crops and flips only)
    flip: bool = True  # random horizontal flips (False for images that are not mirror-symmetric: digits)
    dino_weight: float = 1.0
    ibot_weight: float = 1.0
    koleo_weight: float = 0.1
    ibot_mask_probability: float = 0.5
    ibot_mask_ratio_min: float = 0.1
    ibot_mask_ratio_max: float = 0.5

    def __post_init__(self):
        if self.centering not in CENTERINGS:
            raise ConfigError(f"dino.centering={self.centering!r}: choose one of {', '.join(CENTERINGS)}")
        DinoHeadConfig(self.head_hidden, self.head_bottleneck, self.prototypes, self.head_layers)
        if min(self.student_temp, self.teacher_temp, self.teacher_temp_start) <= 0:
            raise ConfigError("dino.student_temp, teacher_temp and teacher_temp_start must be > 0")
        for name in ("teacher_temp_warmup", "center_momentum", "ibot_mask_probability", "freeze_prototypes"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"dino.{name}={getattr(self, name)}: give a fraction in [0, 1]")
        if not 0.0 <= self.momentum_start <= self.momentum_end <= 1.0:
            raise ConfigError(f"dino.momentum_start={self.momentum_start}, momentum_end={self.momentum_end}: give "
                              "0 <= start <= end <= 1 (DINO: 0.992 -> 1)")
        for kind in ("global", "local", "ibot_mask_ratio"):
            lo, hi = (getattr(self, f"{kind}_min") if kind == "ibot_mask_ratio" else getattr(self, f"{kind}_scale_min"),
                      getattr(self, f"{kind}_max") if kind == "ibot_mask_ratio" else getattr(self, f"{kind}_scale_max"))
            if not 0.0 < lo <= hi <= 1.0:
                raise ConfigError(f"dino.{kind} range ({lo}, {hi}): give 0 < min <= max <= 1")
        if self.local_crops < 0 or (self.local_crops and self.local_crop_size <= 0):
            raise ConfigError(f"dino.local_crops={self.local_crops}, local_crop_size={self.local_crop_size}: give "
                              "a count >= 0 and a size in pixels")
        if min(self.dino_weight, self.ibot_weight, self.koleo_weight) < 0 or self.sinkhorn_iterations < 1:
            raise ConfigError("dino.*_weight must be >= 0 and dino.sinkhorn_iterations >= 1")

    def head(self) -> DinoHeadConfig:
        return DinoHeadConfig(self.head_hidden, self.head_bottleneck, self.prototypes, self.head_layers)


def cosine_momentum(step: jax.Array, total: int, start: float, end: float) -> jax.Array:
    """DINO's teacher momentum at `step` of `total`: end - (end - start) * (cos(pi * step / total) + 1) / 2."""
    frac = jnp.clip(step.astype(jnp.float32) / max(total, 1), 0.0, 1.0)
    return end - (end - start) * (jnp.cos(jnp.pi * frac) + 1.0) / 2.0


def teacher_temperature(step: jax.Array, total: int, d: DinoConfig) -> jax.Array:
    """Linear warm-up from teacher_temp_start to teacher_temp over the first teacher_temp_warmup of the run."""
    warm = max(int(round(d.teacher_temp_warmup * total)), 1)
    frac = jnp.clip(step.astype(jnp.float32) / warm, 0.0, 1.0)
    return d.teacher_temp_start + (d.teacher_temp - d.teacher_temp_start) * frac


@register
class Dino(Objective):
    name = "dino"
    evaluator = "dino"
    settings, settings_type = "dino", DinoConfig
    uses_labels = False
    pretraining = True
    extra_from_params = True  # the teacher starts as the student's copy
    loss_aux = True  # the batch's mean teacher logits move the centres

    def __init__(self, model_cfg, dino: DinoConfig):
        self.d = dino
        self.model = FunctionalViT(model_cfg, functools.partial(DinoViT, head=dino.head(),
                                                                separate_ibot_head=dino.separate_ibot_head))
        self.needs_rng = needs_rng(model_cfg)
        size = model_cfg.image_size[0]
        if model_cfg.image_size[0] != model_cfg.image_size[1]:
            raise ConfigError(f"objective 'dino' crops squares: give a square model.image_size")
        if dino.local_crops and dino.local_crop_size % model_cfg.patch_size[0]:
            raise ConfigError(f"dino.local_crop_size={dino.local_crop_size} is not a multiple of the patch size "
                              f"{model_cfg.patch_size[0]}")
        aug, flip = dino.augment, dino.flip
        g = (dino.global_scale_min, dino.global_scale_max)
        self.specs = (CropSpec(size, g, 1.0, 0.0, aug, flip), CropSpec(size, g, 0.1, 0.2, aug, flip),
                      *[CropSpec(dino.local_crop_size, (dino.local_scale_min, dino.local_scale_max), 0.5, 0.0, aug,
                                 flip)] * dino.local_crops)
        self.grid = model_cfg.grid
        self.flops = self._flops(model_cfg)

    def _flops(self, cfg) -> Flops:
        """Student: 2 global + local crops (trained); teacher: 2 global crops (forward only); heads included."""
        d = self.d
        enc = model_flops(cfg).forward
        local_cfg = cfg.replace(image_size=(d.local_crop_size,) * 2) if d.local_crops else None
        local = model_flops(local_cfg).forward if local_cfg else 0.0
        widths = d.head().layer_sizes(cfg.width)
        head = 2.0 * (sum(a * b for a, b in zip(widths, widths[1:])) + d.head_bottleneck * d.prototypes)
        student = 2 * enc + d.local_crops * local + (2 + d.local_crops) * head
        patches = 2 * cfg.num_patches * head * d.ibot_mask_probability * (d.ibot_mask_ratio_min + d.ibot_mask_ratio_max) / 2
        teacher = 2 * enc + 2 * head + 2 * cfg.num_patches * head
        breakdown = {"global_crops": 2 * enc, "local_crops": d.local_crops * local, "head_per_token": head}
        return Flops(forward=student + patches, breakdown=breakdown, frozen_forward=teacher)

    @classmethod
    def from_config(cls, config, model_cfg):
        return cls(model_cfg, cls.settings_of(config))

    # --- the EMA teacher and centres --------------------------------------------------------------------------------
    def init_extra(self, key, params):
        del key  # the teacher is the student's copy
        k = self.d.prototypes
        return {"teacher": jax.tree.map(jnp.array, params), "center": jnp.zeros((k,), jnp.float32),
                "patch_center": jnp.zeros((k,), jnp.float32), "step": jnp.zeros((), jnp.int32)}

    def extra_logical_axes(self):
        return {"teacher": self.model.logical_axes, "center": (None,), "patch_center": (None,), "step": ()}

    def update_extra(self, extra, params, step, aux):
        m = cosine_momentum(step - 1, self.total_steps, self.d.momentum_start, self.d.momentum_end)
        teacher = jax.tree.map(lambda t, p: (m * t + (1.0 - m) * p).astype(t.dtype), extra["teacher"], params)
        c = self.d.center_momentum
        return {"teacher": teacher, "center": c * extra["center"] + (1 - c) * aux["center"],
                "patch_center": c * extra["patch_center"] + (1 - c) * aux["patch_center"],
                "step": step.astype(jnp.int32)}

    # --- the loss ---------------------------------------------------------------------------------------------------
    def inputs(self, batch, key):
        self.check_batch(batch)
        crops = multi_crop(batch["image"], key, self.specs)
        b = batch["image"].shape[0]
        masks = ibot_masks(key, 2 * b, self.grid, self.d.ibot_mask_probability,
                           (self.d.ibot_mask_ratio_min, self.d.ibot_mask_ratio_max)) if self.d.ibot_weight else None
        out = {"global": jnp.stack(crops[:2], 1)}
        if self.d.local_crops:
            out["local"] = jnp.stack(crops[2:], 1)
        if masks is not None:
            out["masks"] = masks.reshape(b, 2, -1)
        return out

    def targets(self, logits: jax.Array, center: jax.Array, temp: jax.Array,
                weights: jax.Array | None = None) -> jax.Array:
        """Teacher logits (M, K) -> targets (M, K): centred softmax or Sinkhorn-Knopp (over the rows of weight 1)."""
        if self.d.centering == "sinkhorn_knopp":
            return sinkhorn_knopp(logits, temp, self.d.sinkhorn_iterations, weights)
        return centered_softmax(logits, center, temp)

    def terms(self, params, inputs, key, extra, train: bool = True) -> tuple[dict, dict]:
        """Per-example loss terms (B,) and the aux of the centres: the batch means of the teacher's logits."""
        d = self.d
        student, teacher = self.model.bind(params), self.model.bind(extra["teacher"])
        glob = inputs["global"]
        b = glob.shape[0]
        flat = glob.reshape(2 * b, *glob.shape[2:])
        masks = inputs.get("masks")
        flat_masks = masks.reshape(2 * b, -1) if masks is not None else None
        temp = teacher_temperature(extra["step"], self.total_steps, d)

        t_cls, t_patch = teacher.encode(flat)
        t_logits, t_patch_logits = teacher.heads(t_cls, t_patch if masks is not None else None)
        t_logits = jax.lax.stop_gradient(t_logits)
        t_probs = self.targets(t_logits, extra["center"], temp).reshape(b, 2, -1)
        aux = {"center": t_logits.mean(0), "patch_center": extra["patch_center"]}

        k_g, k_l = jax.random.split(key) if (train and self.needs_rng) else (None, None)
        s_cls, s_patch = student.encode(flat, flat_masks, rng=k_g)
        s_logits, s_patch_logits = student.heads(s_cls, s_patch if masks is not None else None)
        s_local = None
        if "local" in inputs:
            loc = inputs["local"]
            l_cls, _ = student.encode(loc.reshape(b * loc.shape[1], *loc.shape[2:]), rng=k_l)
            s_local = student.heads(l_cls)[0].reshape(b, loc.shape[1], -1)
        out = {"dino": dino_loss(t_probs, s_logits.reshape(b, 2, -1), s_local, d.student_temp)}
        if masks is not None:
            tp = jax.lax.stop_gradient(t_patch_logits).astype(jnp.float32)  # (2B, N, K)
            w = flat_masks.astype(jnp.float32).reshape(-1)
            flat_tp = tp.reshape(-1, tp.shape[-1])
            aux["patch_center"] = (flat_tp * w[:, None]).sum(0) / jnp.maximum(w.sum(), 1.0)
            p_probs = self.targets(flat_tp, extra["patch_center"], temp, w).reshape(tp.shape)
            out["ibot"] = ibot_loss(p_probs, s_patch_logits, flat_masks, d.student_temp).reshape(b, 2).mean(1)
        # KoLeo spreads the class tokens within the batch, per global crop (DINOv2); a per-batch term, spread evenly.
        kl = sum(koleo(s_cls.reshape(b, 2, -1)[:, i]) for i in range(2))
        out["koleo"] = jnp.full((b,), kl)
        return out, aux

    def total(self, terms: dict) -> jax.Array:
        d = self.d
        return (d.dino_weight * terms["dino"] + d.ibot_weight * terms.get("ibot", 0.0)
                + d.koleo_weight * terms["koleo"])

    def loss(self, params, inputs, key, extra=None):
        if self.d.freeze_prototypes:  # DINO's freeze_last_layer: no gradient reaches the prototypes early on
            frozen = extra["step"] < int(round(self.d.freeze_prototypes * self.total_steps))
            heads = {name: {**params[name], "prototypes": jnp.where(
                frozen, jax.lax.stop_gradient(params[name]["prototypes"]), params[name]["prototypes"])}
                for name in ("dino_head", "ibot_head") if params.get(name) is not None}
            params = {**params, **heads}
        terms, aux = self.terms(params, inputs, key, extra)
        return jnp.mean(self.total(terms)), aux

    # --- evaluation -----------------------------------------------------------------------------------------------
    def eval_step(self):
        def eval_step(view, batch):
            params, extra = view
            inputs = self.inputs(batch, jax.random.key(EVAL_CROP_KEY))
            inputs.pop("masks", None)
            terms, _ = self.terms(params, {"global": inputs["global"]}, jax.random.key(0), extra, train=False)
            teacher = self.model.bind(extra["teacher"])
            t_cls, _ = teacher.encode(inputs["global"][:, 0])
            probs = self.targets(teacher.heads(t_cls)[0], extra["center"], self.d.teacher_temp)
            entropy = -jnp.sum(probs * jnp.log(probs + 1e-12), -1)
            mask = batch["_mask"].astype(jnp.float32)
            return {"count": mask.sum(), "dino_loss": (terms["dino"] * mask).sum(),
                    "teacher_entropy": (entropy * mask).sum()}

        return eval_step

    def report(self, result, config):
        loss, ent = result["dino_loss"], result["teacher_entropy"]
        return EvalReport({"eval/dino_loss": loss, "eval/teacher_entropy": ent, "eval/count": result["count"]},
                          "eval/dino_loss", False,
                          f"dino loss {loss:.4f} | teacher entropy {ent:.3f} (log K = {math.log(self.d.prototypes):.3f})"
                          f" | {int(result['count'])} examples")


dino_config = Dino.settings_of  # config -> DinoConfig
