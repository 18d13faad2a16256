"""Fixtures: the vLLM server the tests share (helpers in vllm_servers.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # vllm_servers (pytest runs with --import-mode=importlib)

from vllm_servers import start_server  # noqa: E402


@pytest.fixture(scope="session")
def vllm_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm_logs")


@pytest.fixture(scope="session")
def vllm_server(vllm_logs):
    """The server every GRPO test shares: LoRA on, processed log-probs."""
    server = start_server(vllm_logs, "main")
    yield server
    server.stop()


