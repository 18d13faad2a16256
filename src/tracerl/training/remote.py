"""A policy that samples from an OpenAI-compatible server (vLLM, `tracerl serve`) with exact token records.

Rollouts for training need the tokens the model produced and their log-probs, not just text. This
policy keeps the chat bookkeeping on the client (`ChatFormat`, the same code the local backend uses):
it sends the episode's token ids as the prompt of `POST /v1/completions` and asks for the sampled
tokens back as ids (`return_tokens_as_token_ids`, vLLM's extension) with their log-probs, so
`Session.tokens` is built exactly as with `LocalPolicy`, and the server's log-probs are the sampling
log-probs of the importance ratio. The adapter is chosen by the request's `model` field (the name
under which the trainer hot-swaps it).

Each request carries a seed derived from (policy seed, session number, turn), so a rerun against the
same server and weights asks for the same samples.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tracerl.core.messages import Message
from tracerl.core.policy import Session
from tracerl.models.chat import ChatFormat, ChatState
from tracerl.models.local import session_seed


class CompletionsPolicy:
    """`Policy` over `/v1/completions` with token-id prompts; see the module docstring."""

    def __init__(self, base_url: str, model: str, tokenizer: Any, *, temperature: float = 1.0, seed: int = 0,
                 max_tokens: int = 256, api_key: str | None = None, concurrency: int = 16, timeout: float = 300.0,
                 client: httpx.Client | None = None, name: str = "server"):
        self.url = base_url.rstrip("/") + "/completions"
        self.model = model
        self.chat = ChatFormat(tokenizer)
        self.temperature = temperature
        self.seed = seed
        self.max_tokens = max_tokens
        self.concurrency = concurrency
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.Client(timeout=timeout, headers=headers)
        self.name = name
        self._sessions_seen = 0

    def act(self, sessions: list[Session]) -> list[Message]:
        prompts = [self.chat.prepare(s) for s in sessions]
        seeds = []
        for s in sessions:
            state: ChatState = s.state
            if "session_index" not in state.extra:
                state.extra["session_index"] = self._sessions_seen
                self._sessions_seen += 1
            turn = state.extra.get("turn", 0)
            state.extra["turn"] = turn + 1
            seeds.append(session_seed(self.seed, state.extra["session_index"] * 1_000 + turn))
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(sessions)))) as pool:
            samples = list(pool.map(self._complete, prompts, seeds))
        return [self.chat.record(s, ids, lps).message for s, (ids, lps) in zip(sessions, samples, strict=True)]

    def _complete(self, prompt_ids: list[int], seed: int) -> tuple[list[int], list[float]]:
        body = {
            "model": self.model, "prompt": prompt_ids, "max_tokens": self.max_tokens,
            "temperature": self.temperature, "seed": seed % (2**31), "logprobs": 1,
            "stop_token_ids": list(self.chat.stop_ids), "return_tokens_as_token_ids": True,
            "return_token_ids": True, "skip_special_tokens": False,
        }
        response = self.client.post(self.url, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"{self.url}: {response.status_code} {response.text[:300]}")
        choice = response.json()["choices"][0]
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        ids = choice.get("token_ids")
        if ids is None:  # older vLLM: ids only as "token_id:N" strings
            ids = [int(t.split(":", 1)[1]) for t in tokens]
        values = [float(x) for x in (logprobs.get("token_logprobs") or [])]
        if len(values) != len(ids):
            raise RuntimeError(f"{self.url}: {len(ids)} tokens but {len(values)} log-probs")
        return list(ids), values
