#!/usr/bin/env bash
# The image-text demo (#42): configs/demo_clip.py trains both towers from scratch on the digits with generated
# captions, for the sigmoid (SigLIP) and softmax (CLIP) losses, and asserts each run's figures from its summary.json:
# zero-shot top-1 >= 85% on the digits test split with prompt templates never seen in training, in <= 6 minutes of
# wall time (the run's own wall_time_s, on 2 quiet CPU cores; on a shared machine the time check is reported, set
# MAX_SECONDS to widen it). Figures and the command are recorded in docs/image_text.md.
#
#   benchmarks/demo_clip.sh [WORKDIR_ROOT]        # default: workdirs/demo_clip_bench
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${1:-workdirs/demo_clip_bench}"
PY="${PYTHON:-.venv/bin/python}"
MIN_TOP1="${MIN_TOP1:-0.85}"
MAX_SECONDS="${MAX_SECONDS:-360}"
status=0
for variant in siglip clip; do
  work="$ROOT/$variant"
  rm -rf "$work"
  "$PY" -m vit_jax.main --config="configs/demo_clip.py:$variant" --workdir="$work"
  "$PY" - "$work/summary.json" "$variant" "$MIN_TOP1" "$MAX_SECONDS" <<'PYEOF' || status=1
import json, sys
summary, variant, min_top1, max_s = json.load(open(sys.argv[1])), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
final, wall = summary["final"], summary["wall_time_s"]
recalls = " ".join(f"{d} R@{k} {100 * final[f'eval/{d}_recall@{k}']:.1f}" for d in ("i2t", "t2i") for k in (1, 5, 10))
print(f"{variant}: zero-shot top-1 {100 * final['eval/zeroshot_top1']:.2f}% | {recalls} | {wall:.0f} s")
ok = final["eval/zeroshot_top1"] >= min_top1 and wall <= max_s
if not ok:
    print(f"{variant}: FAILED (want zero-shot top-1 >= {100 * min_top1:.0f}% in <= {max_s:.0f} s)")
sys.exit(0 if ok else 1)
PYEOF
done
exit $status
