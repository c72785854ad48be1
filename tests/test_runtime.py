"""The platform choice: a host without accelerators pins JAX to the CPU (libtpu, installed by the test extra, is then
never started: no TPU warnings, no start-up cost); a TPU or GPU host, or an explicit JAX_PLATFORMS, is left alone."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vit_jax import runtime

ROOT = Path(__file__).resolve().parents[1]


def test_importing_vit_jax_on_this_host_chooses_the_platform_before_jax_starts():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS" and not k.startswith("TPU_")}
    env["PYTHONPATH"] = str(ROOT)
    code = "import os, vit_jax, jax; print(os.environ.get('JAX_PLATFORMS', 'unset'), jax.default_backend())"
    r = subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    if runtime.has_accelerator():  # a TPU VM or GPU machine: JAX picks its accelerator as always
        assert r.stdout.split()[0] == "unset"
    else:
        assert r.stdout.split() == ["cpu", "cpu"]
        assert "TPU" not in r.stderr and r.stderr.strip() == ""  # libtpu was not even loaded


def test_an_explicit_platform_or_an_accelerator_is_left_alone(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "")
    monkeypatch.setattr(runtime, "has_accelerator", lambda: False)
    assert runtime.choose_platform() is None and os.environ["JAX_PLATFORMS"] == ""
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setattr(runtime, "has_accelerator", lambda: True)
    assert runtime.choose_platform() is None and "JAX_PLATFORMS" not in os.environ
    monkeypatch.setattr(runtime, "has_accelerator", lambda: False)
    assert runtime.choose_platform() == "cpu" and os.environ["JAX_PLATFORMS"] == "cpu"


@pytest.mark.parametrize("files, pci_class, expected", [
    ({}, None, False),
    ({"/dev/accel*": ["/dev/accel0"]}, None, True),  # TPU v2-v4
    ({"/dev/nvidiactl": ["/dev/nvidiactl"]}, None, True),
    ({}, "0x020000", False),  # a Google network card (gVNIC): every Cloud VM has one
    ({}, "0x120000", True),  # a Google processing accelerator: a TPU chip
])
def test_accelerator_detection(monkeypatch, tmp_path, files, pci_class, expected):
    pci = tmp_path / "0000:00:04.0"
    pci.mkdir()
    (pci / "vendor").write_text("0x1ae0\n")
    (pci / "class").write_text(f"{pci_class}\n")

    def fake_glob(pattern):
        if pattern == "/sys/bus/pci/devices/*/vendor":
            return [str(pci / "vendor")] if pci_class else []
        return files.get(pattern, [])

    monkeypatch.setattr(runtime.glob, "glob", fake_glob)
    assert runtime.has_accelerator() is expected


BLOCK = 64 * 2**20  # the probes' large allocations


def largest_fault_bytes(madvised: bool) -> int:
    """The most anonymous memory one minor page fault can map in on this machine: a transparent huge page where THP
    applies (mode `always`, or `madvise` for memory advised MADV_HUGEPAGE, as numpy does for large arrays and glibc's
    malloc does with GLIBC_TUNABLES glibc.malloc.hugetlb=1), else the base page (4 KiB on x86-64, up to 64 KiB on
    arm64). A bound on fault counts in base pages fails where huge pages serve the memory."""
    page = os.sysconf("SC_PAGE_SIZE")
    thp = Path("/sys/kernel/mm/transparent_hugepage")
    try:
        mode = thp.joinpath("enabled").read_text().split("[", 1)[1].split("]", 1)[0]  # "always [madvise] never"
    except (OSError, IndexError):
        return page  # no THP in this kernel (or not Linux)
    if mode == "always" or (mode == "madvise" and madvised):
        try:
            return max(page, int(thp.joinpath("hpage_pmd_size").read_text()))
        except (OSError, ValueError):
            meminfo = Path("/proc/meminfo").read_text().split("Hugepagesize:", 1)[1].split()
            return max(page, int(meminfo[0]) * 1024)  # "2048 kB"
    return page


def glibc_malloc_madvises() -> bool:
    """Whether glibc's malloc advises its mappings MADV_HUGEPAGE in this environment (inherited by the probes)."""
    return "glibc.malloc.hugetlb=1" in os.environ.get("GLIBC_TUNABLES", "")


MALLOC_PROBE = """
import resource, sys
import numpy as np
from vit_jax import runtime
tuned = runtime.tune_malloc()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
np.ones(64 * 2**20, np.uint8)  # the first touch of a 64 MiB block faults its pages in, tuned or not
before = faults()
for _ in range(4):  # a training step's temporaries: the same large blocks, allocated, filled and freed every step
    np.ones(64 * 2**20, np.uint8)
print(tuned, (faults() - before) // 4)
"""


def test_tuned_malloc_reuses_large_blocks_instead_of_faulting_them_in_every_time():
    def probe(setting: str) -> tuple[str, int]:
        env = {**os.environ, "VIT_JAX_MALLOC": setting, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", MALLOC_PROBE], env=env, capture_output=True, text=True,
                             timeout=120)
        tuned, faults_per_block = out.stdout.split()
        return tuned, int(faults_per_block)

    # glibc's own behaviour: a fresh mapping per block, its pages faulted in again: at least half of a block's pages,
    # huge ones where THP serves numpy's arrays (numpy advises MADV_HUGEPAGE for them; 64 MiB is 32 of 2 MiB).
    default, tuned = probe("default"), probe("")
    assert default[0] == "False" and default[1] >= BLOCK // largest_fault_bytes(madvised=True) // 2, default
    assert tuned[0] == "True" and tuned[1] <= default[1] // 10, (tuned, default)


STEP_PROBE = """
import resource, sys
from vit_jax.runtime import configure_jax
configure_jax(cache_dir="none")
import jax, jax.numpy as jnp
# A program whose temporaries (a 4 x 64 MiB intermediate kept for the reduction) exceed any default mmap threshold,
# as a train step's activations do; XLA:CPU allocates them as one block per execution.
step = jax.jit(lambda x: (jnp.sin(x[None] * jnp.arange(1.0, 5.0)[:, None, None]) ** 2).sum(0).sum())
x = jnp.ones((4096, 4096), jnp.float32)
step(x).block_until_ready(), step(x).block_until_ready()  # compiled, and its first temporaries faulted in
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(faults))  # the steady state: the heap may still grow in the first steps, as other allocations interleave
"""


def test_a_one_device_step_reuses_its_temporaries_instead_of_faulting_them_in_every_step():
    """configure_jax: synchronous CPU dispatch puts XLA:CPU's temporaries in glibc's main arena, where the malloc
    tuning keeps them; with glibc's defaults each execution maps and faults in its temporaries again."""
    def faults(setting: str) -> int:
        env = {**os.environ, "VIT_JAX_MALLOC": setting, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
        env.pop("JAX_CPU_ENABLE_ASYNC_DISPATCH", None)
        out = subprocess.run([sys.executable, "-c", STEP_PROBE], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return int(out.stdout.split()[-1])

    default, tuned = faults("default"), faults("")
    # At least half of one 64 MiB block's pages every step: 4 KiB ones (8192) here, 2 MiB ones (16) where THP is
    # `always` or glibc's malloc advises huge pages (~640 faults per step then, seen with glibc.malloc.hugetlb=1).
    assert default >= BLOCK // largest_fault_bytes(madvised=glibc_malloc_madvises()) // 2, default
    assert tuned <= default // 10, (tuned, default)


def test_a_cpu_process_other_than_0_writes_its_programs_to_the_compilation_cache(monkeypatch):
    """JAX writes cache entries from process 0 only; configure_jax (run by tests/conftest.py) lets every CPU process
    write its own (their keys differ per process, so they cannot contend)."""
    import jax
    import jax.numpy as jnp
    from jax._src import compiler, distributed

    assert getattr(compiler._cache_write, "_vit_jax_every_process", False)
    cache = Path(jax.config.jax_compilation_cache_dir)
    monkeypatch.setattr(distributed.global_state, "process_id", 1)
    before = set(os.listdir(cache))
    # A program no other test or earlier run compiles (its constant is new each run; a fixed one is a cache hit, and
    # no write, in a checkout whose cache an earlier run filled).
    offset = float(time.time_ns() % 1_000_003) + 0.5
    jax.jit(lambda x: x * 3.0 + offset).lower(jnp.ones(17)).compile()
    assert [name for name in set(os.listdir(cache)) - before if name.startswith("jit__lambda")]
