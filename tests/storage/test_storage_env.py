"""Users set only STORAGE_EMULATOR_HOST; vit_jax derives what each storage client needs, and never overrides."""

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
