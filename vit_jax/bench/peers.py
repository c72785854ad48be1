"""The other frameworks' train steps that `vit-jax bench train --compare` times beside ours, in the same process.

A peer is built for the benchmarked model (same width, depth, heads, MLP, patch, image size, classes and pooling), the
same batch of images in [-1, 1] and the same update: softmax cross-entropy, global-norm clipping, AdamW with the
default config's hyper-parameters, fp32. Neither peer is a dependency of vit_jax:

- `timm`: PyTorch eager (`timm.models.vision_transformer.VisionTransformer`, torch's CPU threads = the machine's
  cores, as XLA uses). Install with `pip install torch timm`.
- `big_vision`: google-research/big_vision's `big_vision.models.vit` (flax linen), jitted with the donated state as its
  trainer does, on the same JAX. It is not on PyPI: clone the repository and put its root on PYTHONPATH.

A peer that cannot be imported is reported as such (the benchmark then times vit_jax alone).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable


@dataclasses.dataclass
class Peer:
    name: str
    description: str  # versions and settings, for the report
    step: Callable[[], None]  # one train step, blocking until it is done
    params: int  # the peer model's parameter count: equal to ours when it is the same model


class PeerUnavailable(Exception):
    """The peer's package cannot be imported here; the message says how to install it."""


def _check_comparable(model_cfg) -> None:
    if model_cfg.resnet_layers or model_cfg.window_size or model_cfg.rel_pos or model_cfg.pool not in ("token", "gap"):
        raise SystemExit("--compare times plain ViTs (token or gap pooling): not hybrids, BiT ResNets, windowed or "
                         "relative-position attention, or MAP pooling")


def timm_peer(model_cfg, optimizer_cfg, batch: int) -> Peer:
    _check_comparable(model_cfg)
    try:
        import timm
        import torch
        from timm.models.vision_transformer import VisionTransformer
    except ImportError as e:
        raise PeerUnavailable(f"timm is not installed ({e}); pip install torch timm") from None
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    (h, w), o = model_cfg.image_size, optimizer_cfg
    model = VisionTransformer(img_size=(h, w), patch_size=model_cfg.patch_size[0], num_classes=model_cfg.num_classes,
                              embed_dim=model_cfg.width, depth=model_cfg.depth, num_heads=model_cfg.num_heads,
                              mlp_ratio=model_cfg.mlp_dim / model_cfg.width,
                              global_pool="token" if model_cfg.pool == "token" else "avg",
                              class_token=model_cfg.pool == "token")
    model.train()
    tx = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.b1, o.b2), eps=o.eps, weight_decay=o.weight_decay)
    images = torch.rand(batch, 3, h, w) * 2 - 1  # NCHW, torch's layout
    labels = torch.randint(0, model_cfg.num_classes, (batch,))

    def step() -> None:
        tx.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        if o.grad_clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip_norm)
        tx.step()  # eager: the step is done when this returns

    return Peer("timm", f"timm {timm.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
                        "eager", step, sum(p.numel() for p in model.parameters()))


def big_vision_peer(model_cfg, optimizer_cfg, batch: int) -> Peer:
    _check_comparable(model_cfg)
    try:
        from big_vision.models import vit as bv_vit
    except ImportError as e:
        raise PeerUnavailable(f"big_vision is not importable ({e}); clone google-research/big_vision and put its "
                              "root on PYTHONPATH") from None
    import jax
    import jax.numpy as jnp
    import optax

    (h, w), o = model_cfg.image_size, optimizer_cfg
    model = bv_vit.Model(model_cfg.num_classes, patch_size=tuple(model_cfg.patch_size), width=model_cfg.width,
                         depth=model_cfg.depth, mlp_dim=model_cfg.mlp_dim, num_heads=model_cfg.num_heads,
                         pool_type="tok" if model_cfg.pool == "token" else "gap", posemb="learn")
    tx = optax.chain(*([optax.clip_by_global_norm(o.grad_clip_norm)] if o.grad_clip_norm else []),
                     optax.adamw(o.lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay))
    k_img, k_lab, k_init = jax.random.split(jax.random.key(0), 3)
    images = jax.random.uniform(k_img, (batch, h, w, 3), jnp.float32, -1.0, 1.0)
    labels = jax.random.randint(k_lab, (batch,), 0, model_cfg.num_classes)
    params = jax.jit(model.init)(k_init, images[:1])["params"]
    state = {"params": params, "opt": jax.jit(tx.init)(params)}

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def update(params, opt_state, images, labels):  # big_vision's train.py update, for one objective
        def loss_fn(p):
            logits, _ = model.apply({"params": p}, images, train=True)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def step() -> None:
        state["params"], state["opt"], loss = update(state["params"], state["opt"], images, labels)
        jax.block_until_ready(loss)

    return Peer("big_vision", f"big_vision.models.vit (flax {_version('flax')}), jax {jax.__version__}, jit", step,
                sum(x.size for x in jax.tree.leaves(params)))


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - only for the report
        return "?"


PEERS: dict[str, Callable[..., Peer]] = {"timm": timm_peer, "big_vision": big_vision_peer}
