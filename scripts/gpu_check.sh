#!/usr/bin/env bash
# The prepared GPU check (benchmarks/gpu_check.py): Qwen3-8B- and Qwen3-30B-A3B-shaped models of a few layers,
# random weights in bfloat16, LoRA r 16 on every projection, sampling through the continuous engine, GRPO steps
# on 4k-token episodes, the composed model's forward; peak memory and step time per shape as JSON.
#   bash scripts/gpu_check.sh [--device cuda] [--out gpu_check.json]   # one GPU, under 8 minutes on an H100
#   bash scripts/gpu_check.sh --device cpu --tiny                      # the suite's form (tests/test_gpu_check.py)
# Needs torch, transformers and peft, and tracerl's pure-Python dependencies (pydantic, …): where pydantic is
# missing, the wheels scripts/gpu_deps.sh put in .gpu-deps/<python> are used. Nothing is downloaded; no vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import pydantic" >/dev/null 2>&1; then
  DEPS="$PWD/.gpu-deps/$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
  if [ -d "$DEPS" ]; then
    export PYTHONPATH="$PYTHONPATH:$DEPS"
  else
    echo "error: tracerl needs pydantic here: pip install pydantic, or run scripts/gpu_deps.sh where a package index is reachable" >&2
    exit 2
  fi
fi
exec "$PY" benchmarks/gpu_check.py "$@"
