"""Launchers: local multi-process (local.py), SLURM GPU clusters (slurm.py), Cloud TPU VM pods (tpu_vm.py).

Each is a standalone script (standard library only) that can also be imported, e.g. `from launch import local`.
See docs/launching.md.
"""
