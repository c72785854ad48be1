"""Process-wide JAX set-up: simulated CPU devices, the persistent compilation cache, quiet TensorFlow.

Must run before the first JAX operation (device count and platform are fixed at backend start).
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CACHE_DIR = Path(os.environ.get("VIT_JAX_CACHE_DIR", Path.home() / ".cache" / "vit_jax" / "xla"))


def configure_jax(num_cpu_devices: int | None = None, cache_dir: str | os.PathLike | None = None) -> None:
    """Sets up JAX for this process: call once, early, before any computation."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import jax

    if num_cpu_devices:
        jax.config.update("jax_num_cpu_devices", int(num_cpu_devices))
    cache = Path(cache_dir) if cache_dir else DEFAULT_CACHE_DIR
    if str(cache) not in ("", "none"):
        cache.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(cache))
        # Cache every program, however small or quick: CPU runs recompile the same small steps many times.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def hide_accelerators_from_tensorflow() -> None:
    """TensorFlow (pulled in by TFDS/clu) must not grab GPU memory that JAX needs."""
    try:
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")
    except Exception:  # noqa: BLE001 - TF absent or already initialised: nothing to hide
        pass
