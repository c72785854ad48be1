"""A toy model family and a toy objective, registered from outside the package: what tests/test_seams.py proves the
seams with. It is also a trainer config file (`get_config`), the way a user plugs their own family or objective in:
`python -m vit_jax.main --config=tests/seams_toy.py` or `vit-jax plan --config tests/seams_toy.py` load it, which
registers both.

- Family "Toy": an image flattened, one tanh layer of `width` units, a linear head (variant "toy-<width>").
- Objective "toy_distillation": the student matches a frozen random linear teacher's softened predictions. The
  teacher is the objective's extra state: made by `init_extra`, sharded by logical axes, saved and restored with the
  run, never trained. Its evaluator "toy_agreement" reports how often student and teacher agree on the top class.
"""

# No `from __future__ import annotations`: config loaders execute this file as a module they do not put in
# sys.modules, where dataclasses cannot resolve string annotations.
import dataclasses
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from vit_jax.models import build, family
from vit_jax.models import layers as L
from vit_jax.models.flops import Flops
from vit_jax.train.objectives import EvalReport, Objective, register

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    num_classes: int = 10
    image_size: tuple[int, int] = (8, 8)
    width: int = 16
    dtype: str = "float32"
    remat: str = "none"

    @property
    def name(self) -> str:
        return f"toy-{self.width}"

    @property
    def pixels(self) -> int:
        return self.image_size[0] * self.image_size[1] * 3

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)


class ToyNet(nnx.Module):
    def __init__(self, cfg: ToyConfig, *, rngs: nnx.Rngs):
        init = jax.nn.initializers.lecun_normal()
        self.hidden = L.Linear(cfg.pixels, cfg.width, ("embed", "mlp"), kernel_init=init, param_dtype=jnp.float32,
                               rngs=rngs)
        self.head = (L.Linear(cfg.width, cfg.num_classes, ("mlp", "vocab"), kernel_init=init,
                              param_dtype=jnp.float32, rngs=rngs) if cfg.num_classes else None)

    def __call__(self, images, *, train: bool = False, rng=None):
        features = jnp.tanh(self.hidden(images.reshape(images.shape[0], -1)))
        return (self.head(features) if self.head is not None else features), {"pre_logits": features}


def toy_flops(cfg: ToyConfig) -> Flops:
    parts = {"hidden": 2.0 * cfg.pixels * cfg.width, "head": 2.0 * cfg.width * cfg.num_classes}
    return Flops(forward=sum(parts.values()), breakdown=parts)


def from_training_config(m, num_classes: int, architecture=None) -> ToyConfig:
    width = int(m["variant"].removeprefix("toy-")) if m["variant"] else (m["width"] or 16)
    return ToyConfig(num_classes=num_classes, image_size=(m["image_size"],) * 2, width=width, dtype=m["dtype"])


family.register(family.Family(
    name="Toy", config_type=ToyConfig, module=ToyNet,
    schema={"variant": "Ti/16", "image_size": 224, "width": 0, "dtype": "float32", "remat": "none"},
    owns_variant=lambda variant: variant.startswith("toy-"), from_training_config=from_training_config,
    from_meta=lambda model: ToyConfig(**{**model, "image_size": tuple(model["image_size"])}),
    describe=lambda cfg: f"{cfg.name} (a toy: {cfg.width} tanh units, classes={cfg.num_classes})",
    flops=toy_flops, label=lambda cfg: "Toy"))


@register
class ToyDistillation(Objective):
    name = "toy_distillation"
    evaluator = "toy_agreement"
    settings = "toy_distillation"
    defaults = {"temperature": 2.0}
    uses_labels = False  # the teacher gives the targets

    def __init__(self, model, temperature: float):
        self.model, self.temperature = model, temperature
        self.flops = build.model_flops(model.cfg)

    @classmethod
    def from_config(cls, config, model_cfg):
        return cls(build.build_model(model_cfg), config.toy_distillation.temperature)

    @classmethod
    def head_classes(cls, config, dataset_classes):
        return dataset_classes  # the student predicts the dataset's classes, as the teacher does

    def init_extra(self, key):
        cfg = self.model.cfg
        return {"teacher": {"kernel": jax.random.normal(key, (cfg.pixels, cfg.num_classes), jnp.float32)}}

    def extra_logical_axes(self):
        return {"teacher": {"kernel": ("embed", "vocab")}}

    def teacher_logits(self, extra, images):
        return images.reshape(images.shape[0], -1) @ extra["teacher"]["kernel"]

    def inputs(self, batch, key):
        self.check_batch(batch)
        return {"image": batch["image"]}

    def loss(self, params, inputs, key, extra=None):
        logits, _ = self.model.apply(params, inputs["image"], train=True)
        targets = jax.nn.softmax(self.teacher_logits(extra, inputs["image"]) / self.temperature)
        return -jnp.mean(jnp.sum(targets * jax.nn.log_softmax(logits / self.temperature), axis=-1))

    def eval_step(self):
        def eval_step(view, batch):
            params, extra = view
            logits, _ = self.model.apply(params, batch["image"])
            agree = jnp.argmax(logits, -1) == jnp.argmax(self.teacher_logits(extra, batch["image"]), -1)
            mask = batch["_mask"].astype(jnp.float32)
            return {"count": mask.sum(), "agreement": (agree * mask).sum()}

        return eval_step

    def report(self, result, config):
        return EvalReport({"eval/agreement": result["agreement"], "eval/count": result["count"]}, "eval/agreement",
                          True, f"agreement {100 * result['agreement']:.2f}% | {int(result['count'])} examples")


def get_config(arg=None):
    """configs/demo.py's data and schedule with the toy family and objective: 8 px digits, 4 steps."""
    spec = importlib.util.spec_from_file_location("_toy_demo", HERE.parent / "configs" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    c = demo.get_config()
    c.model.update(variant="toy-16", image_size=8, width=0, depth=0, mlp_dim=0, num_heads=0, patch_size=0,
                   pool="token", posemb="learn")
    c.objective = "toy_distillation"
    c.loss.label_smoothing = 0.0
    c.data.pp_train = c.data.pp_eval = "decode|resize(8)|value_range(-1,1)"
    c.batch_size = 32
    c.total_epochs, c.total_steps = 0.0, 4
    c.optimizer.warmup_epochs, c.optimizer.warmup_steps = 0.0, 1
    c.log_every_steps = 1
    c.eval.evaluators = ("toy_agreement",)
    c.eval.every_epochs, c.eval.every_steps = 0.0, 2
    c.eval.fewshot.datasets = ()
    c.eval.fewshot.every_epochs = 0.0
    c.checkpoint.every_epochs, c.checkpoint.every_steps = 0.0, 2
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    return c
