"""vit_jax.parallel.distributed.cluster_detected: the launchers' VIT_JAX_DISTRIBUTED switch and the detection."""

from __future__ import annotations

import pytest

from vit_jax.parallel import distributed


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in ("VIT_JAX_DISTRIBUTED", "SLURM_JOB_ID", "SLURM_NTASKS", "TPU_WORKER_HOSTNAMES",
                "MEGASCALE_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(key, raising=False)


def test_single_host_by_default():
    assert distributed.cluster_detected() is None


def test_slurm_job_with_several_tasks(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert distributed.cluster_detected() is None  # one task: a single process
    monkeypatch.setenv("SLURM_NTASKS", "16")
    assert distributed.cluster_detected() == "slurm"


def test_the_switch_overrides_detection(monkeypatch):
    monkeypatch.setenv("VIT_JAX_DISTRIBUTED", "auto")  # TPU VM pods: no TPU_* variables in the ssh session
    assert distributed.cluster_detected() == "auto"
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "16")
    monkeypatch.setenv("VIT_JAX_DISTRIBUTED", "off")
    assert distributed.cluster_detected() is None
    monkeypatch.setenv("VIT_JAX_DISTRIBUTED", "yes")
    with pytest.raises(ValueError, match="VIT_JAX_DISTRIBUTED='yes' is not valid; use 'auto', 'off'"):
        distributed.cluster_detected()
