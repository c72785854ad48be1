"""Parallelism: the device mesh, logical-axis sharding rules, multi-process start-up, host <-> global arrays."""
