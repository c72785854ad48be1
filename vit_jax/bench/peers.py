"""The other frameworks' train steps that `vit-jax bench train --compare` times beside ours, interleaved.

A peer is built for the benchmarked model (same width, depth, heads, MLP, patch, image size, classes and pooling), the
same batch of images in [-1, 1] and the same update: softmax cross-entropy, global-norm clipping, AdamW with the
default config's hyper-parameters, fp32. Neither peer is a dependency of vit_jax:

- `timm`: PyTorch eager (`timm.models.vision_transformer.VisionTransformer`, torch's CPU threads = the machine's
  cores, as XLA uses). Install with `pip install torch timm`.
- `big_vision`: google-research/big_vision's `big_vision.models.vit` (flax linen), jitted with the donated state as its
  trainer does, on the same JAX. It is not on PyPI: clone the repository and put its root on PYTHONPATH.

A peer that cannot be imported is reported as such (the benchmark then times vit_jax alone).

By default each peer runs in a process of its own (`own_process`), started with the user's environment and none of
vit_jax's process tuning, so it is timed as its own users run it; `--peer-process shared` builds it in our process.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import resource
import subprocess
import sys
import types
from typing import Callable

from vit_jax.errors import child_failure


@dataclasses.dataclass
class Peer:
    name: str
    description: str  # versions and settings, for the report
    step: Callable[[], None]  # one train step, blocking until it is done
    params: int  # the peer model's parameter count: equal to ours when it is the same model
    process: str = "shared"  # "shared": stepped in the benchmark's process; "own": in a process of its own
    close: Callable[[], None] = lambda: None  # ends the peer's process, if it has one
    # In its own process: the process's CPU seconds (user, system) and minor page faults of each step, as it reports.
    usage: list[dict[str, float]] = dataclasses.field(default_factory=list)


class PeerUnavailable(Exception):
    """The peer's package cannot be imported here; the message says how to install it."""


def _check_comparable(model_cfg) -> None:
    if model_cfg.resnet_layers or model_cfg.window_size or model_cfg.rel_pos or model_cfg.pool not in ("token", "gap"):
        raise SystemExit("--compare times plain ViTs (token or gap pooling): not hybrids, BiT ResNets, windowed or "
                         "relative-position attention, or MAP pooling")


def timm_peer(model_cfg, optimizer_cfg, batch: int) -> Peer:
    _check_comparable(model_cfg)
    try:
        from vit_jax.bench.timm_import import import_timm

        timm = import_timm()  # beside a CPU-only torch too (see timm_import.py)
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

# What a peer reads of the model and optimizer configs: all that crosses to a peer's own process.
_MODEL_FIELDS = ("resnet_layers", "window_size", "rel_pos", "pool", "image_size", "patch_size", "num_classes", "width",
                 "depth", "num_heads", "mlp_dim")
_OPTIMIZER_FIELDS = ("lr", "b1", "b2", "eps", "weight_decay", "grad_clip_norm")


def own_process(factory: Callable[..., Peer], model_cfg, optimizer_cfg, batch: int) -> Peer:
    """`factory`'s peer, built and stepped in a process of its own; its `step()` still blocks until that step is done,
    so the steps stay interleaved with ours.

    Why: runtime.configure_jax tunes glibc malloc and makes JAX's CPU dispatch synchronous for the whole process, and
    a peer stepped in our process gets both for free. That is not the step its users run: on ViT-S/16, batch 32
    (2026-12-05, 2 cores), big_vision's step took 5.6-5.8 s in our process against 7.8-8.3 s in a process of its own
    (6.9-7.5 s alone; 1.4M page faults a step: its temporaries mapped afresh each time), timm's 5.2-5.4 s against
    5.5-5.7 s.
    The child gets this process's environment (the user's, plus settings that only vit_jax reads) and imports no
    vit_jax module that tunes it. Protocol: the child prints one JSON line (the peer's description and parameter
    count, or why it is unavailable), then answers each "step" line on its stdin, once the step is done, with a JSON
    line of what the step cost the process (getrusage).
    """
    _check_comparable(model_cfg)
    spec = {"factory": f"{factory.__module__}:{factory.__qualname__}", "batch": batch,
            "model": {k: getattr(model_cfg, k) for k in _MODEL_FIELDS},
            "optimizer": {k: getattr(optimizer_cfg, k) for k in _OPTIMIZER_FIELDS}}
    serve = ("import sys; from vit_jax.bench.peers import _serve; from vit_jax.errors import run_reporting; "
             "sys.exit(run_reporting(lambda: _serve(sys.argv[1]), 'vit-jax bench train: peer'))")  # user errors: 1 line
    proc = subprocess.Popen([sys.executable, "-c", serve, json.dumps(spec)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # its stderr is ours: its errors show up as they happen

    def read() -> str:
        line = proc.stdout.readline()
        if not line:
            raise child_failure(proc.wait(), f"the peer process for {factory.__name__}")  # its error is printed above
        return line

    usage: list[dict[str, float]] = []

    def step() -> None:
        proc.stdin.write("step\n")
        proc.stdin.flush()
        usage.append(json.loads(read()))

    def close() -> None:
        proc.stdin.close()  # the child exits at the end of its input
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    try:
        hello = json.loads(read())
    except BaseException:
        close()
        raise
    if "unavailable" in hello:
        close()
        raise PeerUnavailable(hello["unavailable"])
    return Peer(hello["name"], hello["description"], step, hello["params"], "own", close, usage)


def _serve(spec_json: str) -> int:
    """The peer's own process (own_process): build the peer, then one step per "step" line until the input ends."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol's own copy of stdout;
    os.dup2(2, 1)  # whatever the frameworks print goes to stderr
    sys.stdout = sys.stderr
    spec = json.loads(spec_json)
    module, name = spec["factory"].split(":")
    factory = getattr(importlib.import_module(module), name)
    try:
        peer = factory(types.SimpleNamespace(**spec["model"]), types.SimpleNamespace(**spec["optimizer"]), spec["batch"])
    except PeerUnavailable as e:
        channel.write(json.dumps({"unavailable": str(e)}) + "\n")
        return 0
    channel.write(json.dumps({"name": peer.name, "description": peer.description, "params": peer.params}) + "\n")
    for line in sys.stdin:
        if line.strip() == "step":
            before = resource.getrusage(resource.RUSAGE_SELF)
            peer.step()
            after = resource.getrusage(resource.RUSAGE_SELF)
            channel.write(json.dumps({"user_s": after.ru_utime - before.ru_utime,
                                      "system_s": after.ru_stime - before.ru_stime,
                                      "minor_faults": after.ru_minflt - before.ru_minflt}) + "\n")
    return 0
