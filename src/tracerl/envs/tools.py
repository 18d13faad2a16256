"""Tools as typed Python functions: the OpenAI schema is derived from the signature and docstring.

    class AirlineTools(Toolbox):
        @tool("read")
        def get_user_details(self, user_id: str) -> dict:
            '''Get the details of a user, including their reservations.

            Args:
                user_id: The user ID, such as 'sara_doe_496'.
            '''

`Toolbox.call(name, arguments_json)` validates and coerces the arguments with pydantic and
returns the tool message text; any problem becomes a text starting with "Error:", never an
exception — the agent sees its mistake and the episode goes on.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from tracerl.core.tools import ToolKind, ToolSchema


class ToolError(Exception):
    """Raised by a tool for a domain error (unknown id, not allowed): becomes 'Error: <message>'."""


def tool(kind: ToolKind) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__tool_kind__ = kind  # type: ignore[attr-defined]
        return fn

    return mark


class _StrictArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """Description (text before 'Args:') and per-argument descriptions (Google style)."""
    doc = inspect.cleandoc(doc or "")
    head, _, args_block = doc.partition("Args:")
    args_block = re.split(r"\n\s*(Returns|Raises):", args_block)[0]
    descriptions: dict[str, str] = {}
    current = None
    for line in args_block.splitlines():
        match = re.match(r"\s*(\w+)\s*(\([^)]*\))?:\s*(.*)", line)
        if match:
            current = match.group(1)
            descriptions[current] = match.group(3).strip()
        elif current and line.strip():
            descriptions[current] += " " + line.strip()
    return " ".join(head.split()), descriptions


class BoundTool:
    """One tool: its schema, its argument model, and the function that runs it."""

    def __init__(self, fn: Callable[..., Any], kind: ToolKind):
        self.fn = fn
        self.kind = kind
        self.name = fn.__name__
        description, arg_docs = _docstring_parts(fn.__doc__ or "")
        fields: dict[str, Any] = {}
        for pname, param in inspect.signature(fn).parameters.items():
            if pname == "self":
                continue
            annotation = param.annotation if param.annotation is not inspect.Parameter.empty else Any
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (annotation, Field(default, description=arg_docs.get(pname)))
        self.args_model = create_model(f"{self.name}_args", __base__=_StrictArgs, **fields)
        parameters = self.args_model.model_json_schema()
        parameters.pop("title", None)
        for spec in parameters.get("properties", {}).values():
            spec.pop("title", None)
        self.schema = ToolSchema(name=self.name, description=description, parameters=parameters, kind=kind)

    def __call__(self, arguments: dict[str, Any]) -> Any:
        parsed = self.args_model.model_validate(arguments)
        return self.fn(**{k: getattr(parsed, k) for k in type(parsed).model_fields})


class Toolbox:
    """A set of tools bound to one state (a database). Subclass and mark methods with @tool."""

    def __init__(self) -> None:
        self._tools: dict[str, BoundTool] = {}
        for name in dir(type(self)):
            member = getattr(type(self), name)
            kind = getattr(member, "__tool_kind__", None)
            if kind is not None:
                self._tools[name] = BoundTool(getattr(self, name), kind)

    @property
    def schemas(self) -> list[ToolSchema]:
        return [t.schema for t in self._tools.values()]

    def kind_of(self, name: str) -> ToolKind | None:
        bound = self._tools.get(name)
        return bound.kind if bound else None

    def call(self, name: str, arguments: str | dict[str, Any]) -> str:
        """Run a tool; return the tool message text (JSON of the result, or 'Error: …')."""
        bound = self._tools.get(name)
        if bound is None:
            return f"Error: unknown tool '{name}'. Available tools: {', '.join(sorted(self._tools))}"
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                return f"Error: arguments of '{name}' are not valid JSON ({e.msg})"
        if not isinstance(arguments, dict):
            return f"Error: arguments of '{name}' must be a JSON object"
        try:
            result = bound(arguments)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "arguments"
            return f"Error: invalid arguments for '{name}': {field}: {err['msg']}"
        except ToolError as e:
            return f"Error: {e}"
        return result_text(result)


def result_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    return json.dumps(result, sort_keys=True, ensure_ascii=False)
