"""Data: TFDS builders (imagenet21k, digits, image folders), robust decoding, op-string preprocessing, and the
deterministic, topology-independent input pipeline that yields global jax.Array batches.

Modules: datasets (names -> prepared datasets), pipeline (train/eval iterators), pp + *_ops + randaug
(preprocessing ops), mixup (on-device), prepare (the prepare-data command), bench (throughput benchmark).
Nothing heavy is imported here.
"""
