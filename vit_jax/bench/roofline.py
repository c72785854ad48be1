"""Roofline of one compiled train step: the fastest a device could run it, and what that means in images/s and MFU.

Per device and step: compute time = FLOPs / peak bf16 FLOP/s, memory time = HBM bytes / HBM bandwidth, and
interconnect time = collective traffic / ICI bandwidth (one direction, all of a chip's links; a ring moves (k-1)/k of
a tensor per device, twice that for an all-reduce). With everything overlapped perfectly the step takes the longest
of the three: that is the lower bound, giving an images/s ceiling and an MFU ceiling (model FLOPs, i.e. the analytic
3 x forward count without rematerialisation, over the peak in that time). Real steps are slower; the point is
which of the three bounds it and by how much.
"""

from __future__ import annotations

from typing import Any

from vit_jax.hardware import Accelerator


def roofline(acc: Accelerator, *, num_devices: int, batch: int, step_flops: float, model_flops: float,
             hbm_bytes: float, ici_bytes: float) -> dict[str, Any]:
    """Per-device step FLOPs / HBM bytes / ICI bytes (as counted in the compiled step) and the analytic model FLOPs of
    the whole step (all devices) -> times, the bound, img/s and MFU ceilings."""
    times = {"compute_s": step_flops / acc.device_peak_flops}
    times["hbm_s"] = hbm_bytes / acc.device_hbm_bw if acc.device_hbm_bw else 0.0
    times["ici_s"] = ici_bytes / acc.device_link_bw if acc.device_link_bw else 0.0
    step = max(times.values())
    bound = max(times, key=times.get)[:-2]
    return {
        **times,
        "step_time_lower_bound_s": step,
        "bound_by": bound,
        "roofline_img_per_s": batch / step if step else float("inf"),
        "mfu_ceiling": model_flops / (num_devices * acc.device_peak_flops * step) if step else 0.0,
        "peak_flops_per_device": acc.device_peak_flops,
        "hbm_bw_per_device": acc.device_hbm_bw,
        "ici_bw_per_device": acc.device_link_bw,
        "hardware_source": acc.source,
    }


def core_days(images: float, img_per_s: float, num_devices: int, acc: Accelerator) -> float:
    """TensorCore-days to process `images` at `img_per_s` on `num_devices` devices (the ViT paper's unit)."""
    return images / img_per_s * num_devices * acc.tensorcores_per_device / 86400.0
