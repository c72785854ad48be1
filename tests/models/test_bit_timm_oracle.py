"""BiT ResNet-v2 (models/bit.py) against an independent implementation: timm's ResNetV2 built as timm builds its
`resnetv2_*_bit` models (fixed-padding stem, StdConv2d with eps 1e-8), with random weights (nothing downloaded),
loaded into ours by our timm loader (checkpoints/bit.py from_bit_timm). Every parameter is random (timm initialises
the last conv of each unit to zero, the norms to the identity; either would hide a wrong residual branch), so a
pre-activation unit in another order, a misplaced stride or a swapped GroupNorm scale and bias changes the logits.

Our fp32 logits are compared with timm's forward in float64, the function itself: both fp32 results round away from
it, and how far grows with depth and logit size (tools/timm_parity_bit.py measures a full R50x1: timm's own fp32 logits
are 3e-4 from its float64 ones at logits of ~14).
"""

import jax
import numpy as np
import pytest

from tests.interop import require_timm
from vit_jax.checkpoints.bit import from_bit_timm
from vit_jax.models.build import build_model

# (layers, width factor, image size): two units in a stage (the second without projection or stride), then a wider
# model; tiny so that the forward passes take milliseconds and one compile each.
CASES = [((2, 1), 1, 32), ((1, 1), 2, 24)]
CLASSES = 5
TOLERANCE = 2e-5  # |ours - timm in float64| over the largest logit (at least 1); seen: 6e-7 to 8e-7


def timm_bit(layers, width_factor: int):
    """timm's ResNetV2 with the settings of timm's _create_resnetv2_bit, random in every parameter."""
    from functools import partial

    import torch
    from timm.layers import StdConv2d
    from timm.models.resnetv2 import ResNetV2

    torch.manual_seed(0)
    model = ResNetV2(layers=list(layers), channels=(256, 512, 1024, 2048)[:len(layers)], num_classes=CLASSES,
                     width_factor=width_factor, stem_type="fixed", conv_layer=partial(StdConv2d, eps=1e-8)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            unit = 1.0 if p.ndim == 1 and name.endswith(".weight") and not name.startswith("head.") else 0.0
            p.copy_(torch.randn_like(p) * (1.0 if p.ndim == 4 and not name.startswith("head.") else 0.2) + unit)
    return model


@pytest.mark.parametrize("layers,width_factor,size", CASES)
def test_bit_forward_matches_timms_resnetv2_in_float64(layers, width_factor, size):
    require_timm()
    import torch

    model = timm_bit(layers, width_factor)
    images = np.random.default_rng(1).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
    with torch.no_grad():
        nchw = torch.from_numpy(images).permute(0, 3, 1, 2)
        timm32 = model(nchw).numpy()
        timm64 = model.double()(nchw.double()).numpy()
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}  # fp32, as timm's files hold them
    cfg, params = from_bit_timm(state, fallback_image_size=size)
    assert (cfg.layers, cfg.width_factor, cfg.num_classes) == (tuple(layers), width_factor, CLASSES)
    ours = np.asarray(jax.jit(build_model(cfg).apply)(params, images)[0])

    scale = max(1.0, float(np.abs(timm64).max()))
    assert np.abs(timm64).max() > 0.5 and np.ptp(timm64, axis=1).min() > 0.1  # logits that tell classes apart
    ours_err, timm_err = (float(np.abs(x - timm64).max()) / scale for x in (ours, timm32))
    assert ours_err <= TOLERANCE, (ours_err, timm_err)
