"""Accelerator facts in one table: peak bf16 FLOP/s, HBM size and bandwidth, interconnect bandwidth, TensorCores,
and how TPU slices are named. The trainer's MFU and TPU-core-days (vit_jax.train.metrics) and the planner's memory
limits and rooflines (`vit-jax plan`) all read this table; nothing else states a hardware number.

Figures are per chip as the vendor publishes them (source beside each row); a JAX device is a chip from TPU v4 on
(v4 and v5p as one "megacore" device of two TensorCores) and a single TensorCore on v2/v3, so `per_device()` divides
by `devices_per_chip`. Interconnect bandwidth is one direction, all of a chip's links together (ICI for TPUs, NVLink
for GPUs). No JAX import here: the table is read by processes that must not start a backend.
"""

from __future__ import annotations

import dataclasses
import platform
import re

GB, GIB = 1e9, 1024**3


@dataclasses.dataclass(frozen=True)
class Accelerator:
    key: str  # the name users type (--accelerator v3, --topology v3:8x8 / v3-128)
    kinds: tuple[str, ...]  # substrings of JAX's device_kind that identify it ("TPU v5 lite"; first match wins)
    peak_flops: float  # dense bf16 FLOP/s per chip
    hbm_bytes: float | None = None  # per chip
    hbm_bw: float | None = None  # bytes/s per chip
    link_bw: float | None = None  # bytes/s per chip, one direction, all ICI / NVLink links
    devices_per_chip: int = 1
    tensorcores_per_chip: int = 0  # TPUs only (the ViT paper counts compute in TPUv3-core-days)
    torus_dims: int = 0  # TPUs: 2D or 3D torus (how slice shapes are written: 8x8 or 4x4x4)
    type_counts: str = ""  # TPUs: what N in the accelerator type 'vX-N' counts: "cores" or "chips"
    gpu_target: str = ""  # GPUs the deviceless compiler can target: vit_jax/resources/gpu_targets/<this>.txtpb
    source: str = ""

    @property
    def is_tpu(self) -> bool:
        return self.torus_dims > 0

    def per_device(self, value: float | None) -> float | None:
        return None if value is None else value / self.devices_per_chip

    @property
    def device_peak_flops(self) -> float:
        return self.peak_flops / self.devices_per_chip

    @property
    def device_hbm_bytes(self) -> float | None:
        return self.per_device(self.hbm_bytes)

    @property
    def device_hbm_bw(self) -> float | None:
        return self.per_device(self.hbm_bw)

    @property
    def device_link_bw(self) -> float | None:
        return self.per_device(self.link_bw)

    @property
    def tensorcores_per_device(self) -> int:
        return self.tensorcores_per_chip // self.devices_per_chip

    @property
    def chip_config(self) -> str:
        """libtpu's name for how a chip's TensorCores form devices ('megacore': one device of two cores)."""
        return "megacore" if self.tensorcores_per_chip == 2 and self.devices_per_chip == 1 else "default"


CACM20 = "Jouppi et al., 'A Domain-Specific Supercomputer for Training Deep Neural Networks', CACM 63(7) 2020, Table 3"
ACCELERATORS: tuple[Accelerator, ...] = (
    # TPUs (v2..v6e): every number from the source named in the row.
    Accelerator("v2", ("TPU v2",), 45e12, 16 * GIB, 700 * GB, 4 * 496e9 / 8, devices_per_chip=2,
                tensorcores_per_chip=2, torus_dims=2, type_counts="cores",
                source=f"{CACM20} (45 TFLOP/s, 16 GiB at 700 GB/s, 4 ICI links x 496 Gbit/s)"),
    Accelerator("v3", ("TPU v3",), 123e12, 32 * GIB, 900 * GB, 4 * 656e9 / 8, devices_per_chip=2,
                tensorcores_per_chip=2, torus_dims=2, type_counts="cores",
                source="cloud.google.com/tpu/docs/v3 (123 TFLOP/s, 32 GiB at 900 GB/s); ICI: " + CACM20 +
                       " (4 links x 656 Gbit/s)"),
    Accelerator("v4", ("TPU v4",), 275e12, 32 * GIB, 1200 * GB, 6 * 45 * GB, tensorcores_per_chip=2, torus_dims=3,
                type_counts="cores",
                source="cloud.google.com/tpu/docs/v4 (275 TFLOP/s, 32 GiB at 1200 GB/s); ICI: JAX scaling book "
                       "(jax-ml.github.io/scaling-book/tpus: 6 links x 4.5e10 B/s one way)"),
    Accelerator("v5e", ("TPU v5 lite", "TPU v5e"), 197e12, 16 * GIB, 819 * GB, 1600e9 / 8, torus_dims=2,
                tensorcores_per_chip=1, type_counts="chips",
                source="cloud.google.com/tpu/docs/v5e (197 TFLOP/s, 16 GB (GiB stacks) at 819 GB/s, ICI 1600 Gbit/s)"),
    Accelerator("v5p", ("TPU v5p", "TPU v5"), 459e12, 95 * GIB, 2765 * GB, 4800e9 / 8, tensorcores_per_chip=2,
                torus_dims=3, type_counts="cores",
                source="cloud.google.com/tpu/docs/v5p (459 TFLOP/s, 95 GiB at 2765 GB/s, ICI 4800 Gbit/s)"),
    Accelerator("v6e", ("TPU v6 lite", "TPU v6e", "TPU v6"), 918e12, 32 * GIB, 1640 * GB, 3584e9 / 8, torus_dims=2,
                tensorcores_per_chip=1, type_counts="chips",
                source="cloud.google.com/tpu/docs/v6e (918 TFLOP/s, 32 GB (GiB stacks) at 1640 GB/s, ICI 3584 Gbit/s)"),
    Accelerator("tpu7x", ("TPU7x",), 2307e12, source="Google Cloud blog 'Ironwood' (2025): 2307 TFLOP/s bf16"),
    # GPUs: NVIDIA datasheets (SXM parts unless named; dense bf16 without sparsity; NVLink 900 / 600 GB/s counts both
    # directions). HBM sizes in GiB as the devices report them (an "80GB" H100 has 80 GiB).
    Accelerator("h200", ("H200",), 989e12, 141 * GIB, 4800 * GB, 450 * GB, gpu_target="h200",
                source="NVIDIA H200 datasheet"),
    Accelerator("h100-pcie", ("H100 PCIe",), 756e12, 80 * GIB, 2000 * GB, source="NVIDIA H100 datasheet (PCIe)"),
    Accelerator("h100-nvl", ("H100 NVL",), 835e12, 94 * GIB, 3900 * GB, source="NVIDIA H100 datasheet (NVL)"),
    Accelerator("h100", ("H100",), 989e12, 80 * GIB, 3350 * GB, 450 * GB, gpu_target="h100",
                source="NVIDIA H100 datasheet (SXM)"),
    Accelerator("a100-40", ("A100-SXM4-40GB", "A100-PCIE-40GB"), 312e12, 40 * GIB, 1555 * GB, 300 * GB,
                source="NVIDIA A100 datasheet (40GB)"),
    Accelerator("a100-80", ("A100",), 312e12, 80 * GIB, 2039 * GB, 300 * GB, source="NVIDIA A100 datasheet (80GB)"),
    Accelerator("b200", ("B200",), 2250e12, source="NVIDIA DGX B200 datasheet (dense bf16 per GPU)"),
    Accelerator("l4", ("L4",), 121e12, 24 * GIB, 300 * GB, source="NVIDIA L4 datasheet"),
)
BY_KEY = {a.key: a for a in ACCELERATORS}
TPU_GENERATIONS = tuple(a.key for a in ACCELERATORS if a.is_tpu)


def get(key: str) -> Accelerator:
    """The accelerator called `key` (v3, v5e, h100, ...); a clear error naming the known ones otherwise."""
    acc = BY_KEY.get(key.lower())
    if acc is None:
        raise KeyError(f"unknown accelerator {key!r}; known: {', '.join(BY_KEY)}")
    return acc


def lookup(device_kind: str) -> Accelerator | None:
    """The row for a JAX device_kind ('TPU v5 lite', 'NVIDIA H100 80GB HBM3'); None when unknown."""
    kind = device_kind.lower()
    for acc in ACCELERATORS:
        if any(k.lower() in kind for k in acc.kinds):
            return acc
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Compile targets. TPU slices: libtpu topology names ("v3:8x8", "v4:2x2x4") and Cloud accelerator types ("v3-128",
# "v4-32"). GPUs: "h100:8" (one host of 8) or "h100:4x8" (4 hosts of 8).

@dataclasses.dataclass(frozen=True)
class Topology:
    generation: Accelerator
    shape: tuple[int, ...]  # TPUs: chips along each torus dimension; GPUs: (hosts, GPUs per host)

    @property
    def name(self) -> str:
        """The name libtpu's topology API takes (GPUs: key:hosts x GPUs)."""
        shape = self.shape[1:] if not self.generation.is_tpu and self.shape[0] == 1 else self.shape
        return f"{self.generation.key}:{'x'.join(map(str, shape))}"

    @property
    def chips(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def num_devices(self) -> int:
        return self.chips * self.generation.devices_per_chip

    @property
    def accelerator_type(self) -> str:
        """The Cloud TPU accelerator type of one slice (v3-128, v5litepod-16, v6e-64); GPUs: 8xh100."""
        g = self.generation
        if not g.is_tpu:
            return f"{self.chips}x{g.key}"
        n = self.chips * (g.tensorcores_per_chip if g.type_counts == "cores" else 1)
        return f"{'v5litepod' if g.key == 'v5e' else g.key}-{n}"


def default_shape(chips: int, dims: int) -> tuple[int, ...]:
    """Cloud TPU's slice shape for a chip count: 2D 1x1, 2x2, 2x4, 4x4, 4x8, ...; 3D 2x2x1, 2x2x2, 2x2x4, 2x4x4,
    4x4x4, 4x4x8, ... (powers of two, the last dimensions doubled first)."""
    if chips < 1 or chips & (chips - 1):
        raise ValueError(f"{chips} chips: TPU slices have a power-of-two number of chips")
    if dims == 3 and chips < 8:
        return (1, 1, 1) if chips == 1 else ((1, 2, 1) if chips == 2 else (2, 2, 1))
    shape = [2, 2, 2] if dims == 3 else [1, 1]
    n, i = (8 if dims == 3 else 1), dims - 1
    while n < chips:
        shape[i] *= 2
        n *= 2
        i = (i - 1) % dims
    return tuple(shape)


def parse_topology(text: str) -> Topology:
    """'v3:8x8' (libtpu's name), 'v3-128' / 'v5litepod-16' / 'v6e-64' (a Cloud accelerator type), or a GPU target
    'h100:8' / 'h200:2x8' (hosts x GPUs)."""
    t = text.strip().lower()
    m = re.fullmatch(r"(v\d+[a-z]*):(\d+(?:x\d+)*)", t)
    if m and m.group(1) in TPU_GENERATIONS:
        gen = BY_KEY[m.group(1)]
        shape = tuple(int(x) for x in m.group(2).split("x"))
        if len(shape) != gen.torus_dims:
            raise ValueError(f"topology {text!r}: TPU {gen.key} slices are {gen.torus_dims}D (e.g. "
                             f"{gen.key}:{'x'.join(map(str, default_shape(8, gen.torus_dims)))})")
        return Topology(gen, shape)
    m = re.fullmatch(r"(v\d+[a-z]*|v5litepod)-(\d+)", t)
    if m and (m.group(1) in TPU_GENERATIONS or m.group(1) == "v5litepod"):
        gen = BY_KEY["v5e" if m.group(1) == "v5litepod" else m.group(1)]
        n = int(m.group(2))
        per_chip = gen.tensorcores_per_chip if gen.type_counts == "cores" else 1
        if n % per_chip:
            raise ValueError(f"accelerator type {text!r}: {gen.key} counts TensorCores, {per_chip} per chip")
        return Topology(gen, default_shape(n // per_chip, gen.torus_dims))
    m = re.fullmatch(r"([a-z0-9\-]+):(?:(\d+)x)?(\d+)", t)
    if m and m.group(1) in BY_KEY and BY_KEY[m.group(1)].gpu_target:
        return Topology(BY_KEY[m.group(1)], (int(m.group(2) or 1), int(m.group(3))))
    gpus = ", ".join(f"{a.key}:8" for a in ACCELERATORS if a.gpu_target)
    raise ValueError(f"unknown topology {text!r}; a TPU slice as libtpu names it (v3:8x8, v4:2x2x4, v5e:4x4) or as a "
                     f"Cloud accelerator type (v3-128, v4-32, v5litepod-16, v6e-64; generations "
                     f"{', '.join(TPU_GENERATIONS)}), or GPUs ({gpus}, or hosts x GPUs: h100:4x8)")


def gpu_target_config(acc: Accelerator) -> str:
    """The XLA GPU target description (text proto) of a GPU the deviceless compiler can target."""
    from importlib import resources

    return (resources.files("vit_jax.resources") / "gpu_targets" / f"{acc.gpu_target}.txtpb").read_text()


def cpu_model() -> str:
    """This machine's CPU model name (Linux's /proc/cpuinfo; else what the platform module reports)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
