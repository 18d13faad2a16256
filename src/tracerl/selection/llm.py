"""The LLM labeller: any OpenAI-compatible chat endpoint (vLLM, OpenAI, `tracerl serve`).

Each trajectory is compacted (message text cut to ~300 characters, tool arguments to ~200,
failure reasons from the reward info kept) and sent with every capability's rubric; the model
answers with a JSON object of labels. Requests run concurrently (bounded), each with a timeout
and retries with exponential backoff; a reply that still does not parse marks the affected
pairs unlabelled — reported in the run's `problems`, excluded from the counts — never a crash
and never a silent default. Runs use temperature > 0 and a distinct seed per run and request.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import openai

from tracerl.contracts import LABELS, Capability, PairLabel
from tracerl.core.errors import InputError
from tracerl.core.trajectory import Trajectory

T = TypeVar("T")

TEXT_LIMIT = 300
ARGS_LIMIT = 200


@dataclass(frozen=True)
class LLMConfig:
    """Endpoint and request settings. Unset base_url / model / api_key come from the environment:
    OPENAI_BASE_URL, TRACERL_LLM_MODEL (or OPENAI_MODEL), OPENAI_API_KEY ("EMPTY" for local servers)."""
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    temperature: float = 0.7
    max_tokens: int = 1024
    concurrency: int = 8
    timeout: float = 60.0
    max_retries: int = 3
    backoff: float = 1.0  # seconds before the first retry; doubles each time

    def resolved(self) -> LLMConfig:
        base_url = self.base_url or os.environ.get("OPENAI_BASE_URL")
        model = self.model or os.environ.get("TRACERL_LLM_MODEL") or os.environ.get("OPENAI_MODEL")
        api_key = self.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        if not base_url:
            raise InputError("the LLM labeller needs an endpoint: --base-url or OPENAI_BASE_URL")
        if not model:
            raise InputError("the LLM labeller needs a model name: --model, TRACERL_LLM_MODEL or OPENAI_MODEL")
        if self.concurrency < 1 or self.max_retries < 0 or self.timeout <= 0:
            raise InputError("LLM settings: concurrency ≥ 1, max retries ≥ 0 and timeout > 0 are required")
        return replace(self, base_url=base_url, model=model, api_key=api_key)


class ChatClient:
    """A thin wrapper over `openai.OpenAI` that returns validated JSON or a one-line problem."""
    def __init__(self, config: LLMConfig):

        self.config = config.resolved()
        self._client = openai.OpenAI(
            base_url=self.config.base_url, api_key=self.config.api_key, timeout=self.config.timeout, max_retries=0
        )

    def json_reply(self, messages: list[dict[str, str]], seed: int, validate: Callable[[Any], T]) -> tuple[T | None, str | None]:
        """Ask until `validate(parsed JSON)` succeeds (at most 1 + max_retries requests, exponential
        backoff between them). Returns (value, None) or (None, the last problem)."""
        problem = None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self.config.backoff * 2 ** (attempt - 1))
            try:
                reply = self._client.chat.completions.create(
                    model=self.config.model,  # type: ignore[arg-type]
                    messages=messages,  # type: ignore[arg-type]
                    temperature=self.config.temperature,
                    max_tokens=self.config.max_tokens,
                    seed=seed,
                )
                text = reply.choices[0].message.content or ""
            except openai.APITimeoutError:
                problem = f"timed out after {self.config.timeout:g} s"
                continue
            except openai.APIConnectionError as e:
                problem = f"cannot reach {self.config.base_url} ({type(e.__cause__ or e).__name__})"
                continue
            except openai.APIStatusError as e:
                problem = f"HTTP {e.status_code} from {self.config.base_url}"
                continue
            except (IndexError, AttributeError, ValueError) as e:
                problem = f"malformed response ({e})"
                continue
            try:
                return validate(extract_json(text)), None
            except ValueError as e:
                problem = f"unparseable reply ({str(e).splitlines()[0][:120]}): {text[:80]!r}"
        return None, problem

    def map(self, fn: Callable[[int], T], n: int) -> list[T]:
        """fn(0..n-1) with at most `concurrency` requests in flight; results in order."""
        with ThreadPoolExecutor(max_workers=self.config.concurrency) as pool:
            return list(pool.map(fn, range(n)))


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


# --- compaction ------------------------------------------------------------------------------

def _cut(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure_reasons(t: Trajectory) -> list[str]:
    """What the grader said went wrong, from the reward info the source kept."""
    reasons = []
    db = t.info.get("db_check")
    if isinstance(db, dict) and db.get("db_match") is False:
        reasons.append("final database does not match the expected one")
    for check in t.info.get("action_checks") or []:
        if isinstance(check, dict) and not check.get("action_match", True):
            action = check.get("action") or {}
            reasons.append(f"expected action not matched: {action.get('name')}({_cut(json.dumps(action.get('arguments', {})), ARGS_LIMIT)})")
    for check in t.info.get("communicate_checks") or []:
        if isinstance(check, dict) and not check.get("met", True):
            reasons.append(f"information not communicated: {_cut(check.get('info', ''), 120)}")
    for key, value in t.reward_breakdown.items():
        if value < 1.0:
            reasons.append(f"reward component {key} = {value:g}")
    return reasons


def compact_trajectory(t: Trajectory) -> str:
    """The trajectory as short text for a labelling prompt."""
    outcome = "PASSED" if t.passed else "FAILED"
    lines = [f"task {t.task_id} ({t.domain}) — {outcome}, reward {t.reward:g}, ended by {t.termination}"]
    reasons = failure_reasons(t)
    if reasons and not t.passed:
        lines.append("grader: " + "; ".join(reasons))
    turn = 0
    for m in t.messages:
        if m.role == "system":
            continue
        if m.role == "assistant":
            turn += 1
            if m.content:
                lines.append(f"[{turn}] assistant: {_cut(m.content, TEXT_LIMIT)}")
            for call in m.tool_calls or []:
                lines.append(f"[{turn}] assistant calls {call.name}({_cut(call.function.arguments, ARGS_LIMIT)})")
        elif m.role == "tool":
            lines.append(f"[{turn}] tool {m.name or ''}: {_cut(m.content or '', TEXT_LIMIT)}")
        else:
            lines.append(f"[{turn}] user: {_cut(m.content or '', TEXT_LIMIT)}")
    return "\n".join(lines)


# --- labelling -------------------------------------------------------------------------------

SYSTEM_PROMPT = """You label transcripts of a tool-using customer-service agent.
For each capability below decide one label:
- NA: the task does not need this capability;
- PRESENT: the task needs it and the agent exercised it;
- LACKING: the task needs it and the agent did not.
When unsure between PRESENT and LACKING, choose PRESENT. Give one short evidence line per
capability naming the turn and tool call it rests on.
Answer with one JSON object only, of the form
{"labels": {"<capability name>": {"label": "NA" | "PRESENT" | "LACKING", "evidence": "<one line>"}, ...}}"""

def capability_block(capabilities: list[Capability]) -> str:
    return "\n".join(
        f"- {c.name}: {c.description}\n  NA: {c.rubric.na}\n  PRESENT: {c.rubric.present}\n  LACKING: {c.rubric.lacking}"
        for c in capabilities
    )


def parse_labels(value: Any, names: list[str]) -> dict[str, PairLabel]:
    """Validated labels from a parsed reply; raises ValueError unless every capability has one.
    The error carries the labels that were valid (`.args[1]`) so a partial reply is not lost."""
    labels = value.get("labels", value) if isinstance(value, dict) else None
    if not isinstance(labels, dict):
        raise ValueError("reply is not an object of labels")
    good: dict[str, PairLabel] = {}
    for name in names:
        entry = labels.get(name)
        if isinstance(entry, str):
            entry = {"label": entry}
        if isinstance(entry, dict) and str(entry.get("label", "")).upper() in LABELS:
            good[name] = PairLabel(label=str(entry["label"]).upper(), evidence=_cut(entry.get("evidence", ""), 200))  # type: ignore[arg-type]
    missing = [n for n in names if n not in good]
    if missing:
        raise ValueError(f"no valid label for {', '.join(missing)}", good)
    return good


class LLMLabeller:
    """Labels every trajectory with one chat request per trajectory (all capabilities at once)."""
    name = "llm"
    deterministic = False

    def __init__(self, config: LLMConfig, client: ChatClient | None = None):
        self.client = client or ChatClient(config)
        self.problems: list[str] = []  # of the last call to label()
        self.on_progress: Callable[[], None] | None = None  # called after each trajectory (progress bars)

    def label(self, trajectories: list[Trajectory], capabilities: list[Capability], run_seed: int) -> list[dict[str, PairLabel]]:
        names = [c.name for c in capabilities]
        system = SYSTEM_PROMPT + "\n\nCapabilities:\n" + capability_block(capabilities)

        def one(i: int) -> tuple[dict[str, PairLabel], str | None]:
            partial: dict[str, PairLabel] = {}

            def validate(value: Any) -> dict[str, PairLabel]:
                try:
                    return parse_labels(value, names)
                except ValueError as e:
                    if len(e.args) > 1 and len(e.args[1]) > len(partial):
                        partial.clear()
                        partial.update(e.args[1])
                    raise ValueError(e.args[0]) from None

            messages = [{"role": "system", "content": system}, {"role": "user", "content": compact_trajectory(trajectories[i])}]
            labels, problem = self.client.json_reply(messages, seed=run_seed * 1_000_003 + i, validate=validate)
            if self.on_progress is not None:
                self.on_progress()
            if labels is not None:
                return labels, None
            row = {n: partial.get(n) or PairLabel(label=None, evidence=f"unlabelled: {problem}") for n in names}
            return row, f"trajectory {i} (task {trajectories[i].task_id}): {problem}"

        results = self.client.map(one, len(trajectories))
        self.problems = [p for _, p in results if p]
        return [row for row, _ in results]
