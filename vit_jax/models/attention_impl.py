"""Which implementation a model's softmax attention lowers to (`model.attention`), per platform.

- `auto` (default): on TPU, Pallas splash attention (attention_splash.py) for sequences of at least
  SPLASH_MIN_TOKENS, XLA's ops below; on GPU, cuDNN's fused flash kernel where its constraints hold (16-bit, head
  dimension a multiple of 8 and at most 128), else XLA's ops; on CPU, this package's float32 kernel (attention_cpu.py).
- `xla`: XLA's ops everywhere (the logits are materialised).
- `cudnn`, `splash`, `cpu`: that kernel. `splash` also runs on CPU, in Pallas's TPU interpret mode (tests, small
  runs); `cudnn` needs a GPU, `cpu` the CPU. A platform that lacks the requested kernel is refused when a run starts
  (`check`); a program lowered for it anyway (a checkpoint trained elsewhere) takes that platform's `auto` choice.
Attention that returns its weights or drops them out (analyses, attention_dropout) always takes the explicit path,
and so does attention with an additive bias (relative positions): neither fused kernel here takes one.

Why 128 tokens: below it the kernel's 128-row blocks are mostly padding and the logits it saves are small (MaxText's
autoselection draws the same line); `vit-jax plan --attention` measures both on the TPU compiler.
"""

from __future__ import annotations

import contextlib
import contextvars
import re

import jax.numpy as jnp

from vit_jax.models import attention_cpu
from vit_jax.models.config import ATTENTION_IMPLEMENTATIONS as IMPLEMENTATIONS, ModelConfigError

SPLASH_MIN_TOKENS = 128
# The platforms each kernel runs on (splash on CPU: interpret mode).
KERNEL_PLATFORMS = {"cudnn": ("gpu",), "splash": ("tpu", "cpu"), "cpu": ("cpu",)}
CUDNN_MAX_HEAD_DIM = 128

_REQUESTED: contextvars.ContextVar[str] = contextvars.ContextVar("attention_implementation", default="auto")
# The device kind the program is lowered for ("TPU v3", "TPU v5 lite"; "" unknown): a platform is not enough, since
# splash's Mosaic kernel does not compile for every TPU generation.
_DEVICE_KIND: contextvars.ContextVar[str] = contextvars.ContextVar("attention_device_kind", default="")


@contextlib.contextmanager
def lowering_for(device_kind: str):
    """While tracing in this context, attention is chosen for devices of `device_kind` (the program's mesh)."""
    token = _DEVICE_KIND.set(device_kind)
    try:
        yield
    finally:
        _DEVICE_KIND.reset(token)


def splash_obstacle(device_kind: str) -> str | None:
    """Why splash cannot compile for these TPUs, or None. Mosaic has no bf16 matmul on TPU v2/v3: the TPU compiler
    refused splash for v3 ("Unsupported matmul RHS type vector<128x128xbf16>", 2026-12-06)."""
    if re.search(r"\btpu v[23]\b", device_kind.lower()):
        return f"splash attention compiles for TPU v4 and newer, not {device_kind}"
    return None


@contextlib.contextmanager
def requested(name: str):
    """While tracing in this context, attention takes implementation `name` (one of IMPLEMENTATIONS)."""
    token = _REQUESTED.set(name)
    try:
        yield
    finally:
        _REQUESTED.reset(token)


def current() -> str:
    return _REQUESTED.get()


def _platform(platform: str) -> str:
    return "gpu" if platform in ("gpu", "cuda", "rocm") else platform


def cudnn_obstacle(dtype, head_dim: int, tokens: tuple[int, int] = (0, 0)) -> str | None:
    """Why cuDNN's fused kernel cannot run this attention (`tokens`: queries, keys), or None."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN's fused attention needs bfloat16 or float16 (compute dtype {jnp.dtype(dtype).name})"
    if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
        return f"cuDNN's fused attention needs a head dimension divisible by 8 and <= {CUDNN_MAX_HEAD_DIM} " \
               f"(got {head_dim})"
    if any(t % 2 for t in tokens):
        # Seen on an H100 (jax 0.11.2, 2026-12-06): the training step of a ViT-B/16 at 224 px (197 tokens) failed to
        # trace with "Unsupported sequence length Q 197, KV 197" from the kernel's backward rule, raised after the
        # forward pass had been traced, where no fallback can catch it. Its forward pass alone accepts odd lengths,
        # but one program serves both, so an odd count keeps XLA's ops.
        return f"cuDNN's fused attention trains only on even token counts (got {tokens[0]}x{tokens[1]})"
    return None


def check(name: str, platform: str, *, dtype, head_dim: int, device_kind: str = "") -> None:
    """Refuses, in one line, a requested kernel that this platform or this model cannot run."""
    platform = _platform(platform)
    if name == "splash" and platform == "tpu" and (why := splash_obstacle(device_kind)):
        raise ModelConfigError(f"model.attention='splash': {why}; use 'auto' or 'xla'")
    if name not in IMPLEMENTATIONS:
        raise ModelConfigError(f"model.attention={name!r} is not one of {IMPLEMENTATIONS}")
    if name in KERNEL_PLATFORMS and platform not in KERNEL_PLATFORMS[name]:
        raise ModelConfigError(f"model.attention={name!r} runs on {' or '.join(KERNEL_PLATFORMS[name])}, not on "
                               f"{platform}: use 'auto' (the platform's best) or 'xla'")
    if name == "cudnn" and (why := cudnn_obstacle(dtype, head_dim)):
        raise ModelConfigError(f"model.attention='cudnn': {why}")
    if name == "cpu" and (why := cpu_obstacle(dtype)):
        raise ModelConfigError(f"model.attention='cpu': {why}")


def cpu_obstacle(dtype) -> str | None:
    if jnp.dtype(dtype) != jnp.dtype(jnp.float32):
        return f"the CPU kernel computes in float32 (compute dtype {jnp.dtype(dtype).name})"
    return attention_cpu.UNAVAILABLE


def choose(name: str, platform: str, *, q_tokens: int, kv_tokens: int, dtype, head_dim: int) -> tuple[str, str]:
    """(implementation, why) for one attention of q_tokens queries over kv_tokens keys lowered for `platform`."""
    platform = _platform(platform)
    if name in KERNEL_PLATFORMS and platform not in KERNEL_PLATFORMS[name]:
        name = "auto"  # lowered where the kernel does not exist (see the module docstring)
    if name == "xla":
        return "xla", "requested"
    if name == "splash" and not (platform == "tpu" and splash_obstacle(_DEVICE_KIND.get())):
        return "splash", "requested" + (" (Pallas interpret mode on CPU)" if platform == "cpu" else "")
    if platform == "tpu":
        if why := splash_obstacle(_DEVICE_KIND.get()):
            return "xla", why
        if min(q_tokens, kv_tokens) >= SPLASH_MIN_TOKENS:
            return "splash", f"auto: {q_tokens}x{kv_tokens} tokens >= {SPLASH_MIN_TOKENS}"
        return "xla", f"auto: {q_tokens}x{kv_tokens} tokens, below splash's {SPLASH_MIN_TOKENS}"
    if platform == "gpu":
        why = cudnn_obstacle(dtype, head_dim, (q_tokens, kv_tokens))
        return ("xla", why) if why else ("cudnn", name if name == "cudnn" else "auto: cuDNN's constraints hold")
    if platform == "cpu":
        why = cpu_obstacle(dtype)
        if why is None and not attention_cpu.enabled():
            why = "XLA's ops requested while tracing (cost analysis or an A/B benchmark)"
        return ("xla", why) if why else ("cpu", name if name == "cpu" else "auto: float32 on CPU")
    return "xla", f"auto: no fused kernel for platform {platform}"


def summary(name: str, platform: str, *, tokens: int, dtype, head_dim: int) -> dict[str, str]:
    """What a run records and logs: the requested implementation and the one its encoder's self-attention uses on
    `platform`, with why (a fallback's reason above all)."""
    impl, why = choose(name, platform, q_tokens=tokens, kv_tokens=tokens, dtype=dtype, head_dim=head_dim)
    return {"requested": name, "used": impl, "why": why}


def for_model(cfg, platform: str, device_kind: str = "") -> dict[str, str] | None:
    """`summary` for a model config with `attention` (the ViT's; None for a family without it), after refusing a
    kernel the platform lacks. The figure is for the longest attention (global blocks); relative positions add a
    bias, which keeps that attention on XLA's ops."""
    name = getattr(cfg, "attention", None)
    if name is None:
        return None
    head_dim = cfg.width // cfg.num_heads
    check(name, platform, dtype=cfg.dtype, head_dim=head_dim, device_kind=device_kind)
    if getattr(cfg, "rel_pos", False):
        return {"requested": name, "used": "xla", "why": "relative position bias (no fused kernel here takes a bias)"}
    with lowering_for(device_kind):
        return summary(name, platform, tokens=cfg.seq_len, dtype=cfg.dtype, head_dim=head_dim)
