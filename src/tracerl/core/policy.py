"""The policy interface every agent implements: scripted reference policies and model backends.

A policy answers a batch of conversations at once. Each episode has a `Session`; the runner
appends the environment's messages to `session.messages`, calls `policy.act(sessions)` and
appends the returned assistant message. Model policies keep their token bookkeeping in
`session.tokens` (built incrementally — see `TokenRecord`) and private state in `session.state`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tracerl.core.messages import Message
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import TokenRecord


@dataclass
class Session:
    messages: list[Message]
    tools: list[ToolSchema]
    info: dict[str, Any] = field(default_factory=dict)  # from env.reset
    seed: int | None = None  # the episode's task seed
    options: dict[str, Any] = field(default_factory=dict)  # the reset options (e.g. {"hint": True})
    adapter: str | None = None  # the LoRA adapter / composition to sample with; None = base model
    tokens: TokenRecord | None = None
    state: Any = None


@runtime_checkable
class Policy(Protocol):
    name: str

    def act(self, sessions: list[Session]) -> list[Message]:
        """The next assistant message of every session, in order."""
        ...
