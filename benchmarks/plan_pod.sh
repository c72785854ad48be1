#!/usr/bin/env bash
# The pod-scale memory plans recorded in docs/BENCHMARKS.md: ViT-B/16, L/16, H/14 at global batch 4096 on 64 and
# 256 devices, ViT-g/14 on 256, bf16 compute, Adam with fp32 moments, FSDP, scan over layers; each searched for the
# cheapest configuration that fits a 16 GiB TPU v3 core. About 5 minutes on 2 CPU cores.
#   benchmarks/plan_pod.sh [OUT_DIR]       (default benchmarks/results); then benchmarks/plan_table.py OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-benchmarks/results}"
mkdir -p "$OUT_DIR"
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"; elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
plan() {  # variant devices extra-args...
  local variant=$1 devices=$2; shift 2
  local tag="plan_${variant//\//}_${devices}${EXTRA_TAG:-}"
  "$PY" -m vit_jax.bench.plan --variant "$variant" --batch-size 4096 --devices "$devices" --mesh 1,-1,1 \
    --accelerator v3 "$@" --output "$OUT_DIR/$tag.json" 2> "$OUT_DIR/$tag.log" | tail -n 1
}
for devices in 64 256; do
  for variant in B/16 L/16 H/14; do plan "$variant" "$devices" --suggest; done
done
plan g/14 256 --suggest
EXTRA_TAG=_estimate plan H/14 64 --suggest --criterion estimate
EXTRA_TAG=_full plan H/14 64 --remat full
"$PY" benchmarks/plan_table.py "$OUT_DIR"
