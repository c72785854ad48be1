"""vit_jax: Vision Transformers (Dosovitskiy et al., 2021) in JAX/Flax, from pretraining to fine-tuning."""

__version__ = "0.1.0"
