"""XLA's own FLOP count of a compiled forward pass, the reference the analytic counts are tested against."""

import jax
import jax.numpy as jnp

from vit_jax.models import attention_cpu


def xla_flops_per_image(model, image_size: tuple[int, int]) -> float:
    """What one more image costs in the compiled forward pass (batch 2 minus batch 1): work done once per batch, such
    as the weight standardisation of convolution kernels, is not per-image compute."""

    def flops(batch):
        with attention_cpu.xla_ops():  # XLA counts no FLOPs inside the CPU attention kernel's custom call
            compiled = jax.jit(lambda p, x: model.apply(p, x)[0]).lower(
                model.shapes, jax.ShapeDtypeStruct((batch, *image_size, 3), jnp.float32)).compile()
        cost = compiled.cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    return flops(2) - flops(1)
