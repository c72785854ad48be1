#!/usr/bin/env bash
# Deviceless GPU plans: the trainer's train and eval steps compiled by XLA's GPU compiler for H100/H200 on a machine
# without a GPU (`vit-jax plan --topology h200:1 ...`), as recorded in docs/BENCHMARKS.md.
#   PYTHON=/path/to/venv/bin/python benchmarks/gpu_plan.sh [OUT_DIR]      (default benchmarks/results/gpu_plan)
# PYTHON must have the gpu extra (pip install -e ".[gpu]": jax[cuda12], about 3 GB of CUDA wheels); no driver or GPU
# is needed (the planner runs JAX with JAX_PLATFORMS=cpu, which keeps the CUDA plugin from looking for one).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-benchmarks/results/gpu_plan}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-.venv/bin/python}"
plan() {  # tag topology args...
  local tag=$1 topology=$2; shift 2
  "$PY" -m vit_jax.bench.plan --topology "$topology" --compiler gpu "$@" --output "$OUT_DIR/$tag.json" \
    2> "$OUT_DIR/$tag.log" | tail -n 1
}
# The batches of benchmarks/gpu_check.sh (one H200, remat off, bf16, 224 px), so the prediction sits beside it.
plan h200_B16_b768 h200:1 --variant B/16 --batch-size 768 --mesh 1,1,1 --no-scan
plan h200_L16_b256 h200:1 --variant L/16 --batch-size 256 --mesh 1,1,1 --no-scan
# An 8-GPU H100 host, ViT-B/16 at the paper's batch 4096, FSDP over the 8 GPUs.
plan h100x8_B16_b4096 h100:8 --variant B/16 --batch-size 4096 --mesh 1,8,1 --remat dots
