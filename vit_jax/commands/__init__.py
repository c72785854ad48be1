"""The command layer: one module per `vit-jax` subcommand that parses its flags and calls the libraries below.

(`vit-jax train` is vit_jax/main.py, so that `python -m vit_jax.main` stays the documented training command;
`bench` and `plan` are the benchmark package's own commands.)
"""
