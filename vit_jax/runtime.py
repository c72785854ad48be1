"""Process-wide set-up: the storage clients' environment, simulated CPU devices, the persistent compilation cache,
quiet TensorFlow.

`configure_storage_env` runs when `vit_jax` is imported (before any storage client is); `configure_jax` must run
before the first JAX operation (device count and platform are fixed at backend start).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_CACHE_DIR = Path(os.environ.get("VIT_JAX_CACHE_DIR", Path.home() / ".cache" / "vit_jax" / "xla"))


def configure_storage_env(environ=os.environ) -> None:
    """Derives every storage client's settings from the standard `STORAGE_EMULATOR_HOST`; idempotent, no imports.

    Always: etils.epath reaches gs:// through fsspec/gcsfs, never tf.io.gfile (which TensorFlow's presence would
    otherwise select): one client for checkpoints, metrics and data, with our retry accounting, and the one the
    tests run against. With an emulator (`STORAGE_EMULATOR_HOST=http://host:port`, as Google's own clients read
    it): tensorstore (Orbax's array writer) gets the same endpoint, gcsfs and tensorstore authenticate
    anonymously instead of searching for credentials, and gcsfs uses its plain client (its default one probes the
    bucket type over gRPC, which an emulator does not serve: a 60 s hang per probe). Values already set win.
    """
    environ.setdefault("EPATH_USE_TF", "false")
    emulator = environ.get("STORAGE_EMULATOR_HOST", "")
    if emulator in ("", "default"):
        return
    if "://" not in emulator:
        emulator = f"http://{emulator}"
    environ.setdefault("TENSORSTORE_GCS_HTTP_URL", emulator)
    environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")  # tensorstore: a fixed token, no search
    environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    environ.setdefault("FSSPEC_GS_TOKEN", "anon")
    fsspec = sys.modules.get("fsspec")
    if fsspec is not None and environ is os.environ:  # fsspec reads FSSPEC_* variables once, at its import
        fsspec.config.conf.setdefault("gs", {}).setdefault("token", environ["FSSPEC_GS_TOKEN"])


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
