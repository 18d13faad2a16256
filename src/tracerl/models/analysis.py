"""The analysis model: any OpenAI-compatible chat endpoint (vLLM, OpenAI, `tracerl serve`) that labels
trajectories, proposes capabilities and writes environments. One configuration, `AnalysisConfig`, for
every use: the run config's `analysis:` section, the `--analysis-*` options of `tracerl select` and
`tracerl synthesize`, the LLM labeller, discovery and the environment writer.

`AnalysisClient` sends each request with a timeout and retries it with exponential backoff; a reply
that does not validate is asked again, as a failed request is. It counts what happened —
requests sent, answers received, answers unusable (malformed), requests that never got an answer
(unreachable, timeouts, HTTP errors, with the server's own error text) — so that a caller can say
what it got, and stop with one line when nothing usable came back (`AnalysisClient.fail_if_nothing`).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import openai
from pydantic import BaseModel, ConfigDict, Field

from tracerl.core.errors import InputError

T = TypeVar("T")


class AnalysisConfig(BaseModel):
    """The analysis model's endpoint and request settings. Unset `base_url` / `model` come from the
    environment: OPENAI_BASE_URL, TRACERL_LLM_MODEL (or OPENAI_MODEL); the key from the variable
    `api_key_env` names ("EMPTY" when unset, as local servers take)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(None, description="the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 "
                                 "(default: $OPENAI_BASE_URL)")
    model: str | None = Field(None, description="the served model's name (default: $TRACERL_LLM_MODEL or $OPENAI_MODEL)")
    api_key_env: str = Field("OPENAI_API_KEY", description="the environment variable holding the API key")
    temperature: float = Field(0.7, ge=0, description="sampling temperature of labelling and discovery (> 0 for the "
                               "LLM labeller: its N runs must be independent samples)")
    max_tokens: int = Field(1024, ge=1, description="tokens per answer (the environment writer asks for more: "
                            "`writer_max_tokens`)")
    writer_max_tokens: int = Field(8000, ge=1, description="tokens per answer of the environment writer")
    concurrency: int = Field(8, ge=1, description="requests in flight at most")
    timeout: float = Field(60.0, gt=0, description="seconds per request")
    max_retries: int = Field(3, ge=0, description="retries per request after a failure or an unusable answer")
    backoff: float = Field(1.0, ge=0, description="seconds before the first retry; doubled before each next one")

    def resolved(self) -> AnalysisConfig:
        """This config with the endpoint and model filled in from the environment; an InputError names
        what is missing."""
        base_url = self.base_url or os.environ.get("OPENAI_BASE_URL")
        model = self.model or os.environ.get("TRACERL_LLM_MODEL") or os.environ.get("OPENAI_MODEL")
        if not base_url:
            raise InputError("the analysis model needs an endpoint: analysis.base_url, --analysis-base-url or "
                             "OPENAI_BASE_URL")
        if not model:
            raise InputError("the analysis model needs a model name: analysis.model, --analysis-model, "
                             "TRACERL_LLM_MODEL or OPENAI_MODEL")
        return self.model_copy(update={"base_url": base_url, "model": model})

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env) or "EMPTY"


@dataclass
class AnalysisStats:
    """What the analysis model was asked and what came back, counted over a client's life."""

    requests: int = 0  # HTTP requests sent (retries included)
    answered: int = 0  # of them, answers received
    unusable: int = 0  # of the answers, ones that did not parse or validate (malformed)
    failed: int = 0  # requests with no answer: unreachable, timed out, HTTP errors
    problems: list[str] = field(default_factory=list)  # one line each, the first ones kept

    def add(self, problem: str | None, *, answered: bool) -> None:
        self.requests += 1
        if answered:
            self.answered += 1
            self.unusable += problem is not None
        else:
            self.failed += 1
        if problem is not None and len(self.problems) < 20:
            self.problems.append(problem)

    @property
    def unusable_share(self) -> float:
        return self.unusable / self.answered if self.answered else 0.0

    def summary(self) -> str:
        """'40 requests: 38 answered, 7 of them unusable (18.4%); 2 without an answer'."""
        text = f"{self.requests} requests: {self.answered} answered"
        if self.answered:
            text += f", {self.unusable} of them unusable ({100 * self.unusable_share:.1f}%)"
        return text + f"; {self.failed} without an answer"


def server_error(e: openai.APIStatusError) -> str:
    """The server's own reason for an HTTP error: OpenAI's {"error": {"message"}}, FastAPI's {"detail"},
    or the body's text."""
    body = e.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        message = message or body.get("detail") or body.get("message")
        if message:
            return " ".join(str(message).split())[:300]
    try:
        text = e.response.text
    except Exception:  # noqa: BLE001 — a streamed or closed body: no text to give
        text = ""
    return " ".join((text or e.message or "").split())[:300]


class AnalysisClient:
    """Requests to the analysis model with timeouts, retries with backoff, validation and counts."""

    def __init__(self, config: AnalysisConfig):
        self.config = config.resolved()
        self.stats = AnalysisStats()
        self._lock = threading.Lock()
        self._client = openai.OpenAI(base_url=self.config.base_url, api_key=self.config.api_key,
                                     timeout=self.config.timeout, max_retries=0)

    @property
    def where(self) -> str:
        return f"{self.config.model} at {self.config.base_url}"

    def _count(self, problem: str | None, *, answered: bool) -> None:
        with self._lock:
            self.stats.add(problem, answered=answered)

    def _request(self, messages: list[dict[str, str]], seed: int | None, max_tokens: int | None,
                 temperature: float | None) -> tuple[str | None, str | None, bool]:
        """One request: (the answer's text or None, the problem or None, whether an answer came)."""
        try:
            reply = self._client.chat.completions.create(
                model=self.config.model,  # type: ignore[arg-type]
                messages=messages,  # type: ignore[arg-type]
                temperature=self.config.temperature if temperature is None else temperature,
                max_tokens=max_tokens or self.config.max_tokens,
                **({"seed": seed} if seed is not None else {}),
            )
            return reply.choices[0].message.content or "", None, True
        except openai.APITimeoutError:
            return None, f"no answer from {self.config.base_url} within {self.config.timeout:g} s", False
        except openai.APIConnectionError as e:
            return None, f"cannot reach {self.config.base_url} ({type(e.__cause__ or e).__name__})", False
        except openai.APIStatusError as e:
            return None, f"HTTP {e.status_code} from {self.config.base_url}: {server_error(e)}", False
        except (IndexError, AttributeError, TypeError, ValueError) as e:
            return None, f"malformed response ({e})", True

    def reply(self, messages: list[dict[str, str]], validate: Callable[[str], T], *, seed: int | None = None,
              max_tokens: int | None = None, temperature: float | None = None) -> tuple[T | None, str | None]:
        """Ask until `validate(answer text)` returns (at most 1 + max_retries requests, exponential backoff
        between them); a ValueError from it marks the answer unusable. (value, None) or (None, the last
        problem, one line)."""
        problem = None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self.config.backoff * 2 ** (attempt - 1))
            text, problem, answered = self._request(messages, None if seed is None else seed + attempt, max_tokens,
                                                    temperature)
            if text is not None:
                try:
                    value = validate(text)
                except ValueError as e:
                    problem = f"unusable answer ({str(e).splitlines()[0][:120]}): {text[:80]!r}"
                else:
                    self._count(None, answered=True)
                    return value, None
            self._count(problem, answered=answered)
        return None, problem

    def json_reply(self, messages: list[dict[str, str]], seed: int, validate: Callable[[Any], T]) -> tuple[T | None, str | None]:
        """`reply` for a JSON answer: `validate(the JSON object in the answer)`."""
        return self.reply(messages, lambda text: validate(extract_json(text)), seed=seed)

    def map(self, fn: Callable[[int], T], n: int) -> list[T]:
        """fn(0..n-1) with at most `concurrency` requests in flight; results in order."""
        with ThreadPoolExecutor(max_workers=self.config.concurrency) as pool:
            return list(pool.map(fn, range(n)))

    def fail_if_nothing(self, what: str, usable: int, total: int) -> None:
        """An InputError (one line, exit 2) when none of `total` `what` got a usable answer: the server's
        last problem and the counts in it."""
        if total and not usable:
            last = self.stats.problems[-1] if self.stats.problems else "no answer"
            raise InputError(f"analysis model {self.where}: none of {total} {what} got a usable answer "
                             f"({self.stats.summary()}); last: {last}")


def extract_json(text: str) -> Any:
    """The JSON object in a model reply (code fences and prose around it tolerated)."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("no JSON object in the reply")
    try:
        return json.loads(text[start : end + 1])
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg}") from None
