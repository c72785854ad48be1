#!/usr/bin/env bash
# Local multi-process launch: N JAX processes on this machine (see launch/local.py for the options).
#   launch/local.sh 2 --cpu-devices 2 -- python -m vit_jax.main --config=configs/demo.py --workdir=/tmp/run
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: launch/local.sh N [options] -- <training command>" >&2
  exit 2
fi
n="$1"
shift
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/local.py" --num-processes "$n" "$@"
