"""Helpers of the storage tests: the bucket, and the environment of the jobs they start."""

from __future__ import annotations

from tests.launch.helpers import job_env

BUCKET = "vit-jax-test"
# What vit_jax.runtime.configure_storage_env derives; jobs must get none of it from the test process.
DERIVED = ("EPATH_USE_TF", "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING",
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "FSSPEC_GS_TOKEN")


def bucket_job_env(emulator_url: str) -> dict[str, str]:
    """A job's environment with only STORAGE_EMULATOR_HOST set for storage, as a user would run it; XLA's default
    flags (the bucket jobs train the demo's model for hundreds of steps: tests/launch/helpers.py TEST_XLA_FLAGS)."""
    env = {k: v for k, v in job_env(xla_flags="").items() if k not in DERIVED}
    env["STORAGE_EMULATOR_HOST"] = emulator_url
    return env
