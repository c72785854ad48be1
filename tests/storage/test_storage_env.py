"""Users set only STORAGE_EMULATOR_HOST; vit_jax derives what each storage client needs, and never overrides."""

import os
from pathlib import Path

from vit_jax import runtime


def test_clients_are_configured_from_the_emulator_variable_alone():
    env = {"STORAGE_EMULATOR_HOST": "127.0.0.1:9023"}
    runtime.configure_storage_env(env)
    assert env == {"STORAGE_EMULATOR_HOST": "127.0.0.1:9023", "EPATH_USE_TF": "false",
                   "TENSORSTORE_GCS_HTTP_URL": "http://127.0.0.1:9023", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
                   "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "FSSPEC_GS_TOKEN": "anon"}
    real = {"EPATH_USE_TF": "true"}  # no emulator: only epath's backend is chosen, and a user's choice stands
    runtime.configure_storage_env(real)
    assert real == {"EPATH_USE_TF": "true"}
    none = {}
    runtime.configure_storage_env(none)
    assert none == {"EPATH_USE_TF": "false"}


def test_an_emulator_set_after_gcsfs_was_imported_still_gets_the_plain_client():
    # gcsfs picks its class at import from GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT: its default one probes every new
    # bucket over gRPC, which an emulator does not serve (60-75 s per bucket name, seen in the test session).
    import subprocess
    import sys

    code = ("import os, fsspec, gcsfs\n"
            "from vit_jax import runtime\n"
            "probing = type(fsspec.filesystem('gs', skip_instance_cache=True))\n"
            "os.environ['STORAGE_EMULATOR_HOST'] = '127.0.0.1:9023'\n"
            "runtime.configure_storage_env()\n"
            "plain = {s: type(fsspec.filesystem(s, skip_instance_cache=True)) for s in ('gs', 'gcs')}\n"
            "print(probing.__name__, plain['gs'] is plain['gcs'] is gcsfs.core.GCSFileSystem)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["ExtendedGcsFileSystem", "True"], out.stderr[-2000:]
