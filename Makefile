# Two commands do all set-up on a fresh machine (Python >= 3.11 with its headers, a C compiler and make):
#   make demo   - builds .venv on first use, then trains the demo ViT on the embedded digits dataset
#   make test   - builds .venv on first use (with the test and interop extras), then runs the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdirs/demo

# The SLURM launcher's tests run a one-node SLURM cluster on localhost (tests/launch/slurm_cluster.py): Debian's
# packages, installed when missing and the user is root (CI); services stay stopped (the tests start their own).
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
SLURM_PROGRAMS := munged mungekey slurmctld slurmd sbatch srun scontrol scancel sinfo squeue

# The input pipeline's cropped JPEG decode (vit_jax/data/_jpeg_crop.c) compiles against libjpeg-turbo's headers:
# libjpeg-dev (Debian: libjpeg62-turbo-dev, Ubuntu: libjpeg-turbo8-dev), installed when missing and the user is root.
JPEG_HEADERS := /usr/include/jpeglib.h

.PHONY: demo test install clean slurm-packages jpeg-headers

$(VENV)/.installed: setup.py pyproject.toml vit_jax/data/_jpeg_crop.c vit_jax/models/_attention_cpu.cc | jpeg-headers
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "vit_jax needs Python >= 3.11 (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,interop]'
	@touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m vit_jax.main --config=configs/demo.py --workdir=$(WORKDIR)

test: $(VENV)/.installed slurm-packages
	$(PY) -m pytest -q -n 3 --dist loadfile --durations=60 tests

slurm-packages:
	@for p in $(SLURM_PROGRAMS); do command -v $$p >/dev/null || missing=1; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "note: $(SLURM_PACKAGES) are missing and only root with apt-get installs them: the SLURM tests will fail"; \
	  exit 0; fi; \
	echo "installing $(SLURM_PACKAGES) (Debian packages) for the SLURM launcher tests"; \
	guard=""; if [ ! -e /usr/sbin/policy-rc.d ]; then guard=1; printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; \
	  chmod 755 /usr/sbin/policy-rc.d; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	{ apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null; }; }; \
	rc=$$?; if [ -n "$$guard" ]; then rm -f /usr/sbin/policy-rc.d; fi; \
	if [ $$rc != 0 ]; then echo "note: installing $(SLURM_PACKAGES) failed: the SLURM tests will fail"; fi

jpeg-headers:
	@if [ -e $(JPEG_HEADERS) ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "note: $(JPEG_HEADERS) is missing: install libjpeg-turbo's headers (libjpeg-dev)"; exit 0; fi; \
	echo "installing libjpeg-dev (libjpeg-turbo's headers) for the cropped JPEG decode"; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get install -y -qq --no-install-recommends libjpeg-dev >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq --no-install-recommends libjpeg-dev >/dev/null; }

clean:
	rm -rf $(VENV) .cache workdirs
