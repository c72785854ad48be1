"""Object storage (gs://): the one place that talks to a bucket for vit_jax's own transfers, and a local GCS
emulator with a fault-injecting proxy for tests and benchmarks.

- `remote`: URL checks with one-line errors, whole-file downloads and uploads, and the count of transient errors
  (retried by the clients) that the trainer logs as `storage/retries`.
- `emulator`: `gcp-storage-emulator` on localhost and `FaultProxy` in front of it (latency, 503s, dropped
  connections, held requests).

Clients: gcsfs (through fsspec and etils.epath: data, metrics, summaries, Orbax's metadata) and tensorstore (Orbax's
arrays). Their settings are derived from `STORAGE_EMULATOR_HOST` in `vit_jax.runtime.configure_storage_env`.
"""
