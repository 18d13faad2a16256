"""Rollout backends for the trainer: the training model itself, or an OpenAI-compatible server.

Local: the policy samples with the live PEFT model, so a step's update is visible to the next
rollouts at once. Server (vLLM, or `tracerl serve`): rollouts come from `RemotePolicy` (exact token
records over `/v1/completions`, the server's log-probs are the sampling log-probs); after each
optimizer step the trainer saves the adapter and `after_step` hot-swaps it on the server (unload,
then load: vLLM's `/v1/unload_lora_adapter` and `/v1/load_lora_adapter`, server started with
`--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) on every server, and checks that
each serves it (`tracerl.training.served`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracerl.core.policy import Policy

if TYPE_CHECKING:
    from tracerl.training.served import ServedCheck

PolicyFactory = Callable[[bool, int], Policy]  # (greedy, seed) -> policy


@dataclass
class LocalBackend:
    """Rollouts from the model being trained (same process, same weights)."""

    make_policy: PolicyFactory
    adapter: str = "default"  # the PEFT adapter the sessions sample with
    needs_adapter_files = False  # the policy samples with the live weights
    samples_with_model = True

    def policy(self, *, greedy: bool, seed: int) -> Policy:
        return self.make_policy(greedy, seed)

    def after_step(self, adapter_dir: Path) -> None:
        """Nothing to do: the policy samples with the live weights."""

    def follow_after_step(self) -> None:
        """Nothing: `after_step` runs no forward."""


class ServerBackend:
    """Rollouts from OpenAI-compatible servers that serve the adapter under the name `adapter`.

    `server_url`: one base URL, several ("a,b" or a list: episodes spread over them, the adapter
    hot-swapped on each). With a `check` (`tracerl.training.served.ServedCheck`), `start()` checks the
    servers before any rollout and every `after_step` checks that each serves the adapter just saved.
    """

    needs_adapter_files = True
    samples_with_model = False

    def __init__(self, server_url: str | list[str], tokenizer: Any, adapter: str, *, temperature: float,
                 max_new_tokens: int, api_key: str | None = None, max_concurrency: int = 64,
                 check: ServedCheck | None = None):
        from tracerl.models.remote import RemotePolicy, split_server_urls

        self.server_urls = split_server_urls(server_url)
        self.tokenizer, self.adapter = tokenizer, adapter
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.api_key, self.max_concurrency = api_key, max_concurrency
        self.control = RemotePolicy(self.server_urls, tokenizer, model=adapter, api_key=api_key)
        self.check = check
        self.served_dir: Path | None = None  # where each swap's copy goes (default: beside the adapter)
        self.swaps = 0
        self._served: Path | None = None  # the copy the servers hold now

    def start(self) -> None:
        """Before any rollout: each server answers, serves a base model and reports sampling log-probs."""
        if self.check is not None:
            self.check.startup(self.control)

    def policy(self, *, greedy: bool, seed: int) -> Policy:
        from tracerl.models.remote import RemotePolicy

        return RemotePolicy(self.server_urls, self.tokenizer, model=self.adapter, api_key=self.api_key,
                            temperature=0.0 if greedy else self.temperature, seed=seed,
                            max_new_tokens=self.max_new_tokens, max_concurrency=self.max_concurrency)

    def after_step(self, adapter_dir: Path) -> None:
        """Serve the adapter just saved in `adapter_dir` on every server (unload, load), then check it.

        vLLM keys its prefix cache by adapter name and path, so reloading changed weights from the
        same path would reuse KV blocks computed with the old ones: each swap loads a fresh copy,
        `served_dir/<n>-<random>` (the servers must be able to read it; the copy before it is removed).
        """
        from tracerl.core.errors import InputError
        from tracerl.models.remote import RemotePolicyError

        root = Path(self.served_dir or Path(adapter_dir) / "served_adapters").resolve()
        path = _fresh_copy(Path(adapter_dir), root / f"{self.swaps:05d}-{secrets.token_hex(4)}")  # new per process too
        for server, url in enumerate(self.server_urls):
            try:
                self.control.swap_adapter(self.adapter, str(path), server=server)
            except RemotePolicyError as e:
                shutil.rmtree(path, ignore_errors=True)
                raise InputError(f"{url}: cannot load the adapter at runtime ({str(e).splitlines()[0][:300]}); start "
                                 "the server with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") from None
        if self._served is not None:
            shutil.rmtree(self._served, ignore_errors=True)
        self._served = path
        self.swaps += 1
        if self.check is not None:
            self.check.after_swap(self.control, self.adapter, f"after swap {self.swaps} ({path})")

    def close(self) -> None:
        """Unload the swapped-in adapter from every server and remove its copy (nothing when none was swapped in)."""
        if self._served is None:
            return
        self.control.unload_adapter(self.adapter, missing_ok=True)
        shutil.rmtree(self._served, ignore_errors=True)
        self._served = None

    def follow_after_step(self) -> None:
        """The trainer-side forwards of `after_step`'s check (`ServedCheck.after_swap`), results unused: run by the
        other ranks of a sharded (FSDP2) model, whose forwards are collectives, while rank 0 checks."""
        if self.check is not None:
            from tracerl.training.served import local_logprobs

            local_logprobs(self.check.model, self.check.prompts, self.check.temperature, adapter=True)


def _fresh_copy(adapter_dir: Path, dest: Path) -> Path:
    """The adapter's files (adapter_config.json, weights) copied into the new folder `dest`, atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    for f in adapter_dir.iterdir():
        if f.is_file() and f.name.startswith("adapter_"):
            shutil.copy2(f, tmp / f.name)
    os.replace(tmp, dest)
    return dest
