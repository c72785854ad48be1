"""Process-wide set-up: the platform choice, the storage clients' environment, simulated CPU devices, the persistent
compilation cache, quiet TensorFlow.

`choose_platform` and `configure_storage_env` run when the `vit_jax` package is imported (vit_jax/__init__.py), before
any of its modules imports JAX or a storage client; `configure_jax` must run before the first JAX operation (device
count and platform are fixed at backend start).
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

DEFAULT_CACHE_DIR = Path(os.environ.get("VIT_JAX_CACHE_DIR", Path.home() / ".cache" / "vit_jax" / "xla"))


# Device files of accelerators JAX can use: TPU v2-v4 (/dev/accel*), TPU v5e and later (VFIO groups), NVIDIA GPUs
# (/dev/dxg: under WSL2), AMD GPUs.
ACCELERATOR_DEVICE_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/dxg",
                            "/dev/kfd")
GOOGLE_PCI_VENDOR = "0x1ae0"


def has_accelerator() -> bool:
    """Whether this host may have a TPU or GPU: an accelerator device file, or a Google PCI device that is neither a
    disk nor a network card (TPU chips are Google PCI devices; so are the gVNIC and NVMe of every Cloud VM). Errs on
    the side of yes: a yes only means JAX picks the platform itself, as it always did."""
    if any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICE_FILES):
        return True
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if open(vendor).read().strip() != GOOGLE_PCI_VENDOR:
                continue
            device_class = open(os.path.join(os.path.dirname(vendor), "class")).read().strip()
        except OSError:
            return True
        if not device_class.startswith(("0x01", "0x02")):  # 0x01: storage, 0x02: network
            return True
    return False


def choose_platform() -> str | None:
    """On a host without any accelerator, pins JAX to the CPU (JAX_PLATFORMS=cpu) unless the user chose a platform.

    Why: with libtpu installed (the `test` extra installs it for the TPU compiler of `vit-jax plan --topology`), a
    JAX left to choose probes for a TPU in every process: a 20 s first start, then ~0.7 s and "could not determine
    TPU accelerator type" warnings per process on a machine that has none. On a TPU VM or a GPU machine nothing is
    changed, so JAX finds the accelerator as before; an explicit JAX_PLATFORMS (even empty) always wins. The TPU
    compiler itself works with JAX_PLATFORMS=cpu (`jax.experimental.topologies`). Returns the platform it set.
    """
    if "JAX_PLATFORMS" in os.environ or has_accelerator():
        return None
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax = sys.modules.get("jax")
    if jax is not None:  # imported before vit_jax: it read the variable already, so set its config (if not started)
        from jax._src import xla_bridge

        if not xla_bridge.backends_are_initialized():
            jax.config.update("jax_platforms", "cpu")
    return "cpu"


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
    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is not None and environ is os.environ and environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false":
        # gcsfs chose its client class at its import, from this variable: imported earlier in this process (before
        # the emulator was set: a notebook, a test session), it kept the probing one, 60-75 s per new bucket name.
        for scheme in ("gs", "gcs"):
            fsspec.register_implementation(scheme, gcsfs.core.GCSFileSystem, clobber=True)


# glibc malloc's tunables (mallopt(3)). By default glibc serves blocks above a (dynamic, at most 32 MiB) threshold
# with a fresh mmap and returns freed memory at the top of the heap to the kernel, so XLA:CPU's per-step temporaries
# and the data pipeline's batches are new mappings every step whose pages the kernel must fault in and zero again
# (expensive in a VM): the demo took 8.3M page faults and 24 s of system time in 74 s (2026-12-02, 2 cores). Kept
# in the process instead (no block mmap'ed by threshold, freed memory never trimmed, the heap grown 512 MiB at a
# time): 0.5M faults, 4.5 s of system time, 61 s, as fast as tcmalloc. The threshold and the trim are unlimited (-1
# is SIZE_MAX to glibc) because XLA:CPU allocates a step's whole temporary buffer as one block (4.39 GB for the
# ViT-S/16 batch-32 train step): under a 1 GiB threshold it was a fresh mapping, ~1.07M page faults and 3.8-13 s of
# system time per 8 s step (2026-12-04). Only the main arena can hold such a block (glibc's per-thread arenas are
# 64 MiB heaps and fall back to mmap), hence synchronous CPU dispatch in configure_jax.
# The number of arenas stays glibc's (8 per core): compiling a program leaves ~16,000 free fragments in the
# compiling thread's arena, and with M_ARENA_MAX 2 XLA's worker threads shared those arenas, so every per-step
# malloc sorted through them (_int_malloc 13% of samples): a process that compiled its train step ran it 25-35%
# slower than one that loaded it from the compilation cache (demo_ssl's MAE step 42 vs 33 ms; the whole SSL demo
# 347 s vs 255 s with an empty cache, 2026-12-04). With an arena per thread the workers' arenas stay clean.
# The cost: a process keeps its peak heap until it exits. VIT_JAX_MALLOC=default leaves glibc's defaults.
_MALLOPT = {"M_TRIM_THRESHOLD": (-1, -1), "M_TOP_PAD": (-2, 512 * 2**20), "M_MMAP_THRESHOLD": (-3, -1)}


def tune_malloc() -> bool:
    """Applies _MALLOPT to this process's glibc malloc (before the first large allocations); False where not glibc
    or switched off by VIT_JAX_MALLOC=default."""
    import ctypes
    import platform

    if os.environ.get("VIT_JAX_MALLOC", "") == "default" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return all(libc.mallopt(param, value) == 1 for param, value in _MALLOPT.values())


_configured = False  # configure_jax has run in this process


def configure_jax(num_cpu_devices: int | None = None, cache_dir: str | os.PathLike | None = None) -> None:
    """Sets up JAX for this process: call once, early, before any computation."""
    global _configured
    _configured = True
    tuned = tune_malloc()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import jax

    if num_cpu_devices:
        jax.config.update("jax_num_cpu_devices", int(num_cpu_devices))
    if tuned and "JAX_CPU_ENABLE_ASYNC_DISPATCH" not in os.environ:
        # A one-device CPU program then runs on the calling (main) thread, so XLA:CPU allocates its temporaries in
        # glibc's main arena, where the malloc tuning above keeps them between steps instead of mapping and faulting
        # in gigabytes every step: the ViT-S/16 train step 8.1-8.4 s -> 6.0-6.5 s, page faults 1.07M -> ~0 per step
        # (2026-12-04, 2 cores); the demo is no slower (53.5 s vs 58-59 s). Multi-device programs stay asynchronous.
        # Without the tuning (VIT_JAX_MALLOC=default, not glibc) it would buy nothing, so dispatch stays async.
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    cache = Path(cache_dir) if cache_dir else DEFAULT_CACHE_DIR
    if str(cache) not in ("", "none"):
        cache.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(cache))
        # Cache every program, however small or quick: CPU runs recompile the same small steps many times.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        cache_cpu_programs_of_every_process()


def cache_cpu_programs_of_every_process() -> None:
    """Lets every process of a multi-process CPU job write its programs to the persistent compilation cache.

    JAX writes entries from process 0 only (several hosts writing one shared cache folder contend, e.g. on GCS). On
    CPU that leaves the other processes without any hit: their cache keys differ from process 0's (the compile
    options and the topology fingerprint hold the process's own devices; measured with JAX 0.10.2's key log, two
    processes on localhost), so process 1 recompiled every program of every 2-process job, ~20 s per job start on
    2 cores, while process 0 waited for it at the first collective. Distinct keys cannot contend, so on CPU each
    process now writes its own. Accelerators keep JAX's rule (a pod's hosts share the cache folder). A JAX without
    the private hook this wraps keeps its own behaviour."""
    from jax._src import compilation_cache, compiler, distributed

    original = getattr(compiler, "_cache_write", None)
    if original is None or getattr(original, "_vit_jax_every_process", False):
        return

    def cache_write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
        if distributed.global_state.process_id == 0 or backend.platform != "cpu" or host_callbacks:
            return original(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks)
        compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                                  int(compile_time_secs))

    cache_write._vit_jax_every_process = True
    compiler._cache_write = cache_write


# XLA:CPU compiles with LLVM at -O2. A program run once per process, like parameter initialisation (an unrolled
# threefry kernel per parameter), spends seconds there for nothing: at -O1 the demo model's init compiles in 1.5 s
# instead of 6.2 s (a tiny BiT 1.4 s vs 2.9 s, ViT-S/16 1.4 s vs 4.1 s, R26+S/32 6.3 s vs 11.4 s) and gives the same
# parameters bit for bit (2026-12-03). Train and eval steps keep -O2: at -O1 they compile no faster.
RUN_ONCE_CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def jit_once(fn, **jit_kwargs):
    """`jax.jit(fn, **jit_kwargs)` for a program a process runs once or rarely: on CPU, compiled for compile speed
    (RUN_ONCE_CPU_COMPILER_OPTIONS). Call it after configure_jax (it starts the backend to learn the platform)."""
    import jax

    options = RUN_ONCE_CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None
    return jax.jit(fn, compiler_options=options, **jit_kwargs)


def prepare_inference_process() -> None:
    """The process set-up of the inference commands (eval, predict, analyze), as training has it: the compilation
    cache and TensorFlow kept off the accelerators. JAX settings made earlier in the process (a test session, a
    caller that configured JAX itself) are kept."""
    if not _configured:
        configure_jax()
    hide_accelerators_from_tensorflow()


def hide_accelerators_from_tensorflow() -> None:
    """TensorFlow (pulled in by TFDS dataset builders) must not grab GPU memory that JAX needs.

    On a host without accelerators there is nothing to hide, and importing TensorFlow only for this would cost every
    process ~5-10 s of start-up before the config is even read."""
    if not has_accelerator():
        return
    try:
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")
    except Exception:  # noqa: BLE001 - TF absent or already initialised: nothing to hide
        pass
