"""Scaling sweeps: a base config times a grid of overrides, run one after another (resumably) by a launcher.

`vit-jax sweep` is vit_jax.commands.sweep; the report it writes lives in vit_jax.report.
"""
