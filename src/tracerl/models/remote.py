"""The remote policy backend: an OpenAI-compatible server (vLLM's, or `tracerl serve`) over token ids.

The chat template is applied *here*, with the model's own tokenizer, and the server only sees
token ids (`/v1/completions` with `prompt=[ids]`): the episode's token record stays exact
(`tracerl.models.chat`), whatever the server's chat handling. Replies come back as token ids
(`return_token_ids`, or `return_tokens_as_token_ids` "token_id:N" tokens) with their sampling
log-probs. Adapters are served by name (`model=<adapter>`), loaded and unloaded at runtime:

    policy = RemotePolicy("http://127.0.0.1:8000/v1", tokenizer, model="base", temperature=1.0)
    policy.swap_adapter("precondition", "/ckpt/precondition/step_10")  # unload (if there), then load
    replies = policy.act(sessions)          # session.adapter = "precondition" or None (base)

The vLLM server that pairs with it (LoRA hot-swapping on, log-probs of the sampling distribution,
no generation-config defaults overriding the request's sampling parameters):

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve Qwen/Qwen3-8B --served-model-name base \\
        --enable-lora --max-lora-rank 16 --max-loras 8 --logprobs-mode processed_logprobs \\
        --generation-config vllm --host 127.0.0.1 --port 8000 [--api-key KEY]

(`--logprobs-mode raw_logprobs`, vLLM's default, is the local backend's default too; pick one
mode on both sides — see `tracerl.models.generation`.) Requests run concurrently up to
`max_concurrency`; each has a timeout and is retried with backoff on connection errors, 408,
409, 429 and 5xx (the openai client's policy); 4xx errors are raised at once.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tracerl.core.messages import Message
from tracerl.core.policy import Session
from tracerl.models.chat import ChatFormat, ChatState
from tracerl.models.local import session_seed


class RemotePolicyError(RuntimeError):
    """The server refused a request (4xx) or kept failing after the retries."""


class RemotePolicy:
    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        *,
        model: str,
        api_key: str | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        seed: int = 0,
        max_concurrency: int = 16,
        timeout: float = 120.0,
        max_retries: int = 3,
        template_kwargs: dict[str, Any] | None = None,
        name: str = "remote",
    ):
        from openai import OpenAI

        self.base_url = base_url.rstrip("/")
        self.chat = ChatFormat(tokenizer, template_kwargs=template_kwargs)
        self.model = model
        self.temperature, self.top_p, self.max_new_tokens, self.seed = temperature, top_p, max_new_tokens, seed
        self.max_concurrency = max_concurrency
        self.timeout, self.max_retries = timeout, max_retries
        self.name = name
        self.api_key = api_key
        self.client = OpenAI(base_url=self.base_url, api_key=api_key or "EMPTY", timeout=timeout, max_retries=max_retries)
        self._sessions_seen = 0

    # --- policy ---------------------------------------------------------------------------
    def act(self, sessions: list[Session]) -> list[Message]:
        prompts = [self.chat.prepare(s) for s in sessions]
        for s in sessions:
            state: ChatState = s.state
            if "index" not in state.extra:
                state.extra["index"] = self._sessions_seen
                state.extra["turn"] = 0
                self._sessions_seen += 1
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(sessions)))) as pool:
            results = list(pool.map(self._complete, sessions, prompts))
        replies = []
        for s, (token_ids, logprobs) in zip(sessions, results, strict=True):
            replies.append(self.chat.record(s, token_ids, logprobs).message)
        return replies

    def _complete(self, session: Session, prompt: list[int]) -> tuple[list[int], list[float]]:
        import openai

        state: ChatState = session.state
        turn_seed = session_seed(self.seed, state.extra["index"] * 1000 + state.extra["turn"]) % (2**31)
        state.extra["turn"] += 1
        try:
            response = self.client.completions.create(
                model=session.adapter or self.model,
                prompt=prompt,
                max_tokens=self.max_new_tokens,
                temperature=self.temperature,
                top_p=self.top_p,
                logprobs=1,
                seed=turn_seed,
                extra_body={"top_k": -1, "stop_token_ids": list(self.chat.stop_ids), "return_tokens_as_token_ids": True,
                            "return_token_ids": True, "skip_special_tokens": False},
            )
        except openai.APIStatusError as e:
            raise RemotePolicyError(f"{self.base_url}: {e.status_code} {_message(e)}") from None
        except openai.APIConnectionError as e:
            raise RemotePolicyError(f"{self.base_url}: no answer after {self.max_retries} retries ({e})") from None
        choice = response.choices[0]
        return token_ids_and_logprobs(choice, self.chat)

    # --- adapters (vLLM's runtime LoRA endpoints) ----------------------------------------
    def load_adapter(self, name: str, path: str | Path) -> None:
        """POST /v1/load_lora_adapter. `path` must be readable by the server."""
        self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_adapter(self, name: str, missing_ok: bool = False) -> None:
        """POST /v1/unload_lora_adapter."""
        try:
            self._post("/unload_lora_adapter", {"lora_name": name})
        except RemotePolicyError as e:
            if not (missing_ok and "404" in str(e)):
                raise

    def swap_adapter(self, name: str, path: str | Path) -> None:
        """Hot-swap after an optimizer step: unload `name` if loaded, then load it from `path`."""
        self.unload_adapter(name, missing_ok=True)
        self.load_adapter(name, path)

    def list_models(self) -> list[str]:
        return [m.id for m in self.client.models.list().data]

    def _post(self, path: str, body: dict[str, Any]) -> str:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        delay = 0.5
        for attempt in range(self.max_retries + 1):
            try:
                r = httpx.post(self.base_url + path, json=body, headers=headers, timeout=self.timeout)
            except httpx.TransportError as e:
                if attempt == self.max_retries:
                    raise RemotePolicyError(f"{self.base_url}{path}: no answer after {self.max_retries} retries ({e})") from None
            else:
                if r.status_code < 400:
                    return r.text
                if r.status_code < 500 and r.status_code not in (408, 409, 429):
                    raise RemotePolicyError(f"{self.base_url}{path}: {r.status_code} {_error_text(r)}")
                if attempt == self.max_retries:
                    raise RemotePolicyError(f"{self.base_url}{path}: {r.status_code} after {self.max_retries} retries: {_error_text(r)}")
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


def token_ids_and_logprobs(choice: Any, chat: ChatFormat) -> tuple[list[int], list[float]]:
    """The sampled token ids and log-probs of a completions choice (vLLM or tracerl serve).

    Ids come from `token_ids` (vLLM ≥ 0.10.2 / `return_token_ids`) or from "token_id:N" tokens
    (`return_tokens_as_token_ids`). A server that drops the final stop token from the ids while
    reporting finish_reason "stop" gets it appended back as context by the bookkeeping.
    """
    extra = getattr(choice, "model_extra", None) or {}
    logprobs = choice.logprobs
    if logprobs is None or logprobs.token_logprobs is None:
        raise RemotePolicyError("the server returned no log-probs (is `logprobs` supported?)")
    token_logprobs = [float(x) if x is not None else 0.0 for x in logprobs.token_logprobs]
    ids = extra.get("token_ids") or getattr(choice, "token_ids", None)
    if ids is None:
        try:
            ids = [int(t.split("token_id:", 1)[1]) for t in logprobs.tokens]
        except (IndexError, ValueError, TypeError, AttributeError):
            raise RemotePolicyError("the server returned no token ids (needs return_token_ids or return_tokens_as_token_ids)") from None
    ids = [int(t) for t in ids]
    if len(ids) != len(token_logprobs):
        raise RemotePolicyError(f"{len(ids)} token ids but {len(token_logprobs)} log-probs")
    return ids, token_logprobs


def _message(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in body:
            return str(body["message"])
    return str(e)


def _error_text(r: httpx.Response) -> str:
    try:
        data = r.json()
        err = data.get("error", data) if isinstance(data, dict) else data
        return str(err.get("message", err)) if isinstance(err, dict) else str(err)
    except ValueError:
        return r.text[:300]

