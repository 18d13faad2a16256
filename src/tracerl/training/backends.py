"""Rollout backends for the trainer: the training model itself, or an OpenAI-compatible server.

Local: the policy samples with the live PEFT model, so a step's update is visible to the next
rollouts at once. Server (vLLM, or `tracerl serve`): rollouts come from `RemotePolicy` (exact token
records over `/v1/completions`, the server's log-probs are the sampling log-probs); after each
optimizer step the trainer saves the adapter and `after_step` hot-swaps it on the server (unload,
then load: vLLM's `/v1/unload_lora_adapter` and `/v1/load_lora_adapter`, server started with
`--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.core.policy import Policy

PolicyFactory = Callable[[bool, int], Policy]  # (greedy, seed) -> policy


@dataclass
class LocalBackend:
    """Rollouts from the model being trained (same process, same weights)."""

    make_policy: PolicyFactory
    adapter: str = "default"  # the PEFT adapter the sessions sample with
    needs_adapter_files = False  # the policy samples with the live weights

    def policy(self, *, greedy: bool, seed: int) -> Policy:
        return self.make_policy(greedy, seed)

    def after_step(self, adapter_dir: Path) -> None:
        """Nothing to do: the policy samples with the live weights."""


class ServerBackend:
    """Rollouts from an OpenAI-compatible server that serves the adapter under the name `adapter`."""

    needs_adapter_files = True

    def __init__(self, server_url: str, tokenizer: Any, adapter: str, *, temperature: float, max_new_tokens: int,
                 api_key: str | None = None, max_concurrency: int = 64):
        from tracerl.models.remote import RemotePolicy

        self.server_url, self.tokenizer, self.adapter = server_url, tokenizer, adapter
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.api_key, self.max_concurrency = api_key, max_concurrency
        self.control = RemotePolicy(server_url, tokenizer, model=adapter, api_key=api_key)
        self.swaps = 0

    def policy(self, *, greedy: bool, seed: int) -> Policy:
        from tracerl.models.remote import RemotePolicy

        return RemotePolicy(self.server_url, self.tokenizer, model=self.adapter, api_key=self.api_key,
                            temperature=0.0 if greedy else self.temperature, seed=seed,
                            max_new_tokens=self.max_new_tokens, max_concurrency=self.max_concurrency)

    def after_step(self, adapter_dir: Path) -> None:
        """Replace the server's adapter with the one just saved in `adapter_dir` (must be readable by the server)."""
        self.control.swap_adapter(self.adapter, str(Path(adapter_dir).resolve()))
        self.swaps += 1
