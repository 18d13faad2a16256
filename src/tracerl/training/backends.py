"""Rollout backends for the trainer: the training model itself, or an OpenAI-compatible vLLM server.

Local: the policy samples with the live PEFT model, so a step's update is visible to the next
rollouts at once. Server: after each optimizer step the trainer saves the adapter and
`VLLMAdapterSync.swap` unloads and reloads it on the server (`vllm serve --enable-lora` with
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`); the server's log-probs are the sampling log-probs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from tracerl.core.policy import Policy

PolicyFactory = Callable[[bool, int], Policy]  # (greedy, seed) -> policy


@dataclass
class LocalBackend:
    """Rollouts from the model being trained (same process, same weights)."""

    make_policy: PolicyFactory
    needs_adapter_files = False  # the policy samples with the live weights

    def policy(self, *, greedy: bool, seed: int) -> Policy:
        return self.make_policy(greedy, seed)

    def after_step(self, adapter_dir: Path) -> None:
        """Nothing to do: the policy samples with the live weights."""


class VLLMAdapterSync:
    """Hot-swaps a LoRA adapter on a vLLM server: POST /v1/unload_lora_adapter, then /v1/load_lora_adapter."""

    def __init__(self, base_url: str, lora_name: str, *, api_key: str | None = None,
                 client: httpx.Client | None = None, timeout: float = 120.0):
        root = base_url.rstrip("/")
        self.root = root[: -len("/v1")] if root.endswith("/v1") else root
        self.lora_name = lora_name
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.Client(timeout=timeout, headers=headers)
        self.swaps = 0

    def swap(self, adapter_dir: str | Path) -> None:
        """Replace the server's adapter `lora_name` with the one in `adapter_dir` (absolute path)."""
        unload = self.client.post(f"{self.root}/v1/unload_lora_adapter", json={"lora_name": self.lora_name})
        if unload.status_code >= 400 and not (self.swaps == 0 and unload.status_code in (400, 404)):
            raise RuntimeError(f"vLLM refused to unload adapter '{self.lora_name}': {unload.status_code} {unload.text[:200]}")
        load = self.client.post(f"{self.root}/v1/load_lora_adapter",
                                json={"lora_name": self.lora_name, "lora_path": str(Path(adapter_dir).resolve())})
        if load.status_code >= 400:
            raise RuntimeError(f"vLLM refused to load adapter '{self.lora_name}': {load.status_code} {load.text[:200]}")
        self.swaps += 1


@dataclass
class ServerBackend:
    """Rollouts from an OpenAI-compatible server that serves the adapter under `sync.lora_name`."""

    make_policy: PolicyFactory
    sync: VLLMAdapterSync
    needs_adapter_files = True

    def policy(self, *, greedy: bool, seed: int) -> Policy:
        return self.make_policy(greedy, seed)

    def after_step(self, adapter_dir: Path) -> None:
        self.sync.swap(adapter_dir)
