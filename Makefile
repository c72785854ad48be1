# Two commands do all set-up on a fresh machine (Python >= 3.11 and make):
#   make demo   - builds .venv on first use, then trains the demo ViT on the embedded digits dataset
#   make test   - builds .venv on first use, then runs the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdirs/demo

.PHONY: demo test install clean

$(VENV)/.installed: setup.py
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "vit_jax needs Python >= 3.11 (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m vit_jax.main --config=configs/demo.py --workdir=$(WORKDIR)

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) .cache workdirs
