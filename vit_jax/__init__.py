"""vit_jax: Vision Transformers (Dosovitskiy et al., 2021) in JAX/Flax, from pretraining to fine-tuning."""

from vit_jax import runtime as _runtime

__version__ = "0.1.0"

# Before any vit_jax module imports JAX: on a host without accelerators, JAX must not probe for a TPU (see runtime).
_runtime.choose_platform()
# Before any storage client is imported (gcsfs, tensorstore and etils read their settings once).
_runtime.configure_storage_env()
