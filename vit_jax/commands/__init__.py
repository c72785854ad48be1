"""The command layer: one module per `vit-jax` subcommand that parses its flags and calls the libraries below.

(`vit-jax train` is vit_jax/main.py, `python -m vit_jax.main`; `predict` and `convert` are vit_jax/predict.py and
vit_jax/checkpoints/convert.py until they move here; `bench` and `plan` are the benchmark package's own commands.)
"""
