"""Mesh construction and the logical-axis rules table."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from vit_jax.models import vit_config
from vit_jax.models.vit import FunctionalViT
from vit_jax.parallel import mesh as mesh_lib


def test_mesh_shapes():
    assert jax.device_count() == 8  # tests/conftest.py simulates 8 CPU devices
    assert dict(mesh_lib.make_mesh().shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert dict(mesh_lib.make_mesh(data=-1, fsdp=2, tensor=2).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    with pytest.raises(ValueError, match="needs 12 devices"):
        mesh_lib.make_mesh(data=3, fsdp=2, tensor=2)
    assert mesh_lib.make_mesh(devices=jax.devices()[:1]).size == 1


def test_rules_map_logical_axes_and_fall_back_when_not_divisible():
    m = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
    assert mesh_lib.logical_to_spec(("layers", "embed", "mlp"), (4, 64, 128), m) == P(None, "fsdp", "tensor")
    assert mesh_lib.logical_to_spec(("embed", "vocab"), (64, 10), m) == P("fsdp", "tensor")
    assert mesh_lib.logical_to_spec(("embed", "vocab"), (64, 21843), m) == P("fsdp", None)  # odd head: replicate
    assert mesh_lib.logical_to_spec(("batch", "seq", "act_embed"), (16, 5, 64), m) == P(("data", "fsdp"), None, None)
    assert mesh_lib.logical_to_spec(("batch",), (6,), m) == P("data")  # 6 % 4 != 0: fewer axes
    pure_dp = mesh_lib.make_mesh()
    assert mesh_lib.logical_to_spec(("embed", "mlp"), (64, 128), pure_dp) == P(None, None)  # DP: replicated
    with pytest.raises(KeyError, match="no sharding rule"):
        mesh_lib.logical_to_spec(("nonsense",), (4,), m)


def test_param_and_optimizer_state_shardings():
    import optax

    m = mesh_lib.make_mesh(data=2, fsdp=4, tensor=1)
    model = FunctionalViT(vit_config(width=64, depth=2, mlp_dim=128, num_heads=4, patch_size=8, image_size=32,
                                     num_classes=8))
    sh = mesh_lib.tree_shardings(model.logical_axes, model.shapes, m)
    assert sh["encoder"]["blocks"]["mlp"]["fc1"]["kernel"].spec == P(None, "fsdp", None)
    opt = jax.eval_shape(optax.adam(1e-3).init, model.shapes)
    opt_sh = mesh_lib.shardings_like_params(opt, sh, model.shapes, m)
    mu = opt_sh[0].mu
    assert mu["encoder"]["blocks"]["mlp"]["fc1"]["kernel"].spec == P(None, "fsdp", None)
    assert opt_sh[0].count.spec == P()
    # Initialising straight into the shardings: each device holds a quarter of the fsdp-sharded kernel.
    params = jax.jit(model.init, out_shardings=sh)(jax.random.key(0))
    k = params["encoder"]["blocks"]["mlp"]["fc1"]["kernel"]
    assert k.addressable_shards[0].data.shape == (2, 16, 128)
    assert float(jnp.abs(k).sum()) > 0
