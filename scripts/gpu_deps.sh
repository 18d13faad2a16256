#!/usr/bin/env bash
# tracerl's pure-Python dependencies that a bare GPU image with torch, transformers and peft may lack (pydantic and
# its own), unpacked per Python version into .gpu-deps/cp3XX for scripts/gpu_check.sh, from the package index:
#   bash scripts/gpu_deps.sh [3.10 3.11 3.12 3.13]
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-$( [ -x .venv/bin/pip ] && echo .venv/bin/pip || echo pip3 )}"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.10 3.11 3.12 3.13)
for v in "${versions[@]}"; do
  target=".gpu-deps/cp${v/./}"
  rm -rf "$target"
  "$PIP" install -q --target "$target" --python-version "$v" --implementation cp --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 'pydantic>=2.7,<3'
done
du -sh .gpu-deps
