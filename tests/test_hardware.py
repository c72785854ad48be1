"""The one hardware table: per-device figures, device-kind lookup, and TPU slice names."""

import pytest

from vit_jax import hardware


def test_per_device_figures_of_each_tpu_generation():
    # (peak bf16 TFLOP/s, HBM GiB, HBM GB/s) per JAX device: v2/v3 devices are single TensorCores (half a chip)
    expected = {"v2": (22.5, 8, 350), "v3": (61.5, 16, 450), "v4": (275, 32, 1200), "v5e": (197, 16, 819),
                "v5p": (459, 95, 2765), "v6e": (918, 32, 1640)}
    for key, (tflops, gib, gbps) in expected.items():
        acc = hardware.get(key)
        assert acc.is_tpu and acc.source
        assert (acc.device_peak_flops / 1e12, acc.device_hbm_bytes / hardware.GIB, acc.device_hbm_bw / 1e9) == \
            pytest.approx((tflops, gib, gbps))
        assert acc.device_link_bw > 0
    assert hardware.TPU_GENERATIONS == ("v2", "v3", "v4", "v5e", "v5p", "v6e")
    with pytest.raises(KeyError, match="unknown accelerator 'v9'"):
        hardware.get("v9")


@pytest.mark.parametrize("kind, key", [("TPU v3", "v3"), ("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5", "v5p"),
                                       ("TPU v6 lite", "v6e"), ("NVIDIA H100 80GB HBM3", "h100"),
                                       ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA A100-SXM4-40GB", "a100-40"),
                                       ("NVIDIA A100-SXM4-80GB", "a100-80"), ("cpu", None)])
def test_device_kind_lookup(kind, key):
    acc = hardware.lookup(kind)
    assert (acc.key if acc else None) == key


@pytest.mark.parametrize("text, name, devices, accelerator_type", [
    ("v3:8x8", "v3:8x8", 128, "v3-128"), ("v3-128", "v3:8x8", 128, "v3-128"), ("v3-8", "v3:2x2", 8, "v3-8"),
    ("v4-8", "v4:2x2x1", 4, "v4-8"), ("v4-32", "v4:2x2x4", 16, "v4-32"), ("v4:4x4x4", "v4:4x4x4", 64, "v4-128"),
    ("v5p-128", "v5p:4x4x4", 64, "v5p-128"), ("v5litepod-16", "v5e:4x4", 16, "v5litepod-16"),
    ("v6e-8", "v6e:2x4", 8, "v6e-8"), ("v6e:16x16", "v6e:16x16", 256, "v6e-256"), ("v2-32", "v2:4x4", 32, "v2-32"),
    ("h100:8", "h100:8", 8, "8xh100"), ("h200:2x8", "h200:2x8", 16, "16xh200"), ("H200:1x4", "h200:4", 4, "4xh200"),
])
def test_topology_names_and_accelerator_types(text, name, devices, accelerator_type):
    t = hardware.parse_topology(text)
    assert (t.name, t.num_devices, t.accelerator_type) == (name, devices, accelerator_type)


@pytest.mark.parametrize("text, message", [("v4:8x8", "3D"), ("v9:2x2", "unknown topology"), ("a100-40:8", "unknown topology"),
                                           ("v4-12", "power-of-two"), ("v4-7", "counts TensorCores")])
def test_bad_topologies(text, message):
    with pytest.raises(ValueError, match=message):
        hardware.parse_topology(text)


def test_gpu_compile_targets_ship_with_the_package():
    for key in ("h100", "h200"):
        text = hardware.gpu_target_config(hardware.get(key))
        assert "cuda_compute_capability" in text and f'"NVIDIA {key.upper()}' in text
