"""vit_jax: Vision Transformers (Dosovitskiy et al., 2021) in JAX/Flax, from pretraining to fine-tuning."""

__version__ = "0.1.0"

# Before any vit_jax module imports JAX: on a host without accelerators, JAX must not probe for a TPU (see runtime).
from vit_jax.runtime import choose_platform as _choose_platform  # noqa: E402

_choose_platform()
