"""Chat messages in OpenAI format — the lingua franca of vLLM, τ²-bench and TRL."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: str = "{}"  # a JSON text, as in the OpenAI API (may be malformed: the env answers with an error)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    @classmethod
    def make(cls, name: str, arguments: dict[str, Any], call_id: str) -> ToolCall:
        return cls(id=call_id, function=FunctionCall(name=name, arguments=canonical_json(arguments)))

    @property
    def name(self) -> str:
        return self.function.name

    def parsed_arguments(self) -> dict[str, Any] | None:
        """The arguments as a dict, or None when they are not a JSON object."""
        try:
            value = json.loads(self.function.arguments)
        except (json.JSONDecodeError, TypeError):
            return None
        return value if isinstance(value, dict) else None


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None  # tool messages: the id of the call they answer
    name: str | None = None  # tool messages: the tool's name

    @classmethod
    def system(cls, content: str) -> Message:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls(role="user", content=content)

    @classmethod
    def assistant(cls, content: str | None = None, tool_calls: list[ToolCall] | None = None) -> Message:
        return cls(role="assistant", content=content, tool_calls=tool_calls or None)

    @classmethod
    def tool(cls, content: str, tool_call_id: str, name: str) -> Message:
        return cls(role="tool", content=content, tool_call_id=tool_call_id, name=name)

    @property
    def is_error(self) -> bool:
        return self.role == "tool" and (self.content or "").startswith("Error:")

    def to_openai(self) -> dict[str, Any]:
        """The dict a chat template or an OpenAI-compatible server expects (None fields left out)."""
        return self.model_dump(exclude_none=True)


class Action(BaseModel):
    """A tool call without an id: a gold action, or an action an agent took."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def key(self) -> str:
        return f"{self.name}({canonical_json(self.arguments)})"


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def tool_calls_of(messages: list[Message]) -> list[ToolCall]:
    return [call for m in messages if m.role == "assistant" for call in (m.tool_calls or [])]
