#!/usr/bin/env bash
# timm parity check: our timm export (and, for hybrids, our official-layout npz) loaded by real timm gives our logits.
# Not part of the test suite (timm and torch are not dependencies). Needs a second environment with torch + timm:
#   python3 -m venv /tmp/timmenv && /tmp/timmenv/bin/pip install torch torchvision timm safetensors numpy
#   TIMM_PYTHON=/tmp/timmenv/bin/python tools/timm_parity/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="$(mktemp -d)"
"${PYTHON:-.venv/bin/python}" tools/timm_parity/export.py "$OUT"
"${TIMM_PYTHON:?set TIMM_PYTHON to a python with torch and timm}" tools/timm_parity/check.py "$OUT"
# SAM-style backbones (timm's VisionTransformerSAM, samvit_base_patch16 at 1024 px): timm writes, vit_jax compares.
"$TIMM_PYTHON" tools/timm_parity_sam.py timm "$OUT"
"${PYTHON:-.venv/bin/python}" tools/timm_parity_sam.py ours "$OUT"
