"""A ViT with DeiT's distillation token exports to timm's layout, and to the .npz layouts (which have no place for
the token or its head) with a one-line error naming the way out instead of an internal assertion."""

import jax
import pytest
from safetensors import safe_open

from vit_jax.checkpoints import formats, vit_formats
from vit_jax.checkpoints.layouts import LAYOUTS
from vit_jax.models.build import build_model
from vit_jax.models.config import vit_config

CFG = vit_config(None, num_classes=10, image_size=16, patch_size=4, width=32, depth=1, mlp_dim=64, num_heads=2,
                 distilled=True)


@pytest.fixture(scope="module")
def params():
    return build_model(CFG).init(jax.random.key(0))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_npz_layouts_refuse_in_one_line(params, layout, tmp_path):
    with pytest.raises(formats.ExportError, match=f"distillation token .*{layout} .npz layout.*--to timm") as e:
        vit_formats.export(CFG, params, str(tmp_path / "x.npz"), formats.ExportRequest(to=layout))
    assert "\n" not in str(e.value) and not (tmp_path / "x.npz").exists()


def test_timm_keeps_both_heads(params, tmp_path):
    vit_formats.export(CFG, params, str(tmp_path / "x.safetensors"), formats.ExportRequest(to="timm"))
    with safe_open(str(tmp_path / "x.safetensors"), "np") as f:
        assert {"dist_token", "head_dist.weight", "head.weight"} <= set(f.keys())
