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
from typing import Any, Literal, Union

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


_DERIVED: dict[tuple[Callable[..., Any], str], tuple[type[BaseModel], ToolSchema]] = {}


def _derive(fn: Callable[..., Any], kind: ToolKind) -> tuple[type[BaseModel], ToolSchema]:
    """The argument model and schema of a tool function, derived once per function (a Toolbox is
    built per episode; deriving nine pydantic models each time dominated rollout time)."""
    key = (fn, kind)
    if key not in _DERIVED:
        name = fn.__name__
        description, arg_docs = _docstring_parts(fn.__doc__ or "")
        fields: dict[str, Any] = {}
        for pname, param in inspect.signature(fn, eval_str=True).parameters.items():
            if pname == "self":
                continue
            annotation = param.annotation if param.annotation is not inspect.Parameter.empty else Any
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (annotation, Field(default, description=arg_docs.get(pname)))
        args_model = create_model(f"{name}_args", __base__=_StrictArgs, **fields)
        parameters = args_model.model_json_schema()
        parameters.pop("title", None)
        for spec in parameters.get("properties", {}).values():
            spec.pop("title", None)
        _DERIVED[key] = (args_model, ToolSchema(name=name, description=description, parameters=parameters, kind=kind))
    args_model, schema = _DERIVED[key]
    return args_model, schema.model_copy(deep=True)


class BoundTool:
    """One tool: its schema, its argument model, and the function that runs it."""
    def __init__(self, fn: Callable[..., Any], kind: ToolKind):
        self.fn = fn
        self.kind = kind
        self.name = fn.__name__
        self.args_model, self.schema = _derive(getattr(fn, "__func__", fn), kind)

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


# --- tools behind a given schema (a τ²-bench tools.json entry) --------------------------------------


def args_model_from_schema(schema: ToolSchema) -> type[BaseModel]:
    """A pydantic model that validates a call's arguments against the schema's parameter types.

    Handles what tools.json files use: string/integer/number/boolean/array/object, `enum`,
    `anyOf`, `$ref` into `$defs`; unknown keys are rejected, missing required ones reported.
    """
    params = schema.parameters
    defs = params.get("$defs", {})
    return _object_model(f"{schema.name}_args", params, defs, {})


def _object_model(name: str, spec: dict[str, Any], defs: dict[str, Any], cache: dict[str, Any]) -> type[BaseModel]:
    required = set(spec.get("required", []))
    fields: dict[str, Any] = {}
    for pname, pspec in spec.get("properties", {}).items():
        annotation = _annotation(pspec, defs, cache, f"{name}_{pname}")
        if pname in required:
            fields[pname] = (annotation, ...)
        else:
            fields[pname] = (annotation | None, pspec.get("default"))
    return create_model(name, __base__=_StrictArgs, **fields)


def _annotation(spec: dict[str, Any], defs: dict[str, Any], cache: dict[str, Any], name: str) -> Any:

    if "$ref" in spec:
        ref = spec["$ref"].split("/")[-1]
        if ref not in cache:
            cache[ref] = _annotation(defs.get(ref, {}), defs, cache, ref)
        return cache[ref]
    if "anyOf" in spec:
        options = tuple(_annotation(s, defs, cache, f"{name}_{i}") for i, s in enumerate(spec["anyOf"]))
        return Union[options]  # noqa: UP007
    if "enum" in spec:
        return Literal[tuple(spec["enum"])]
    kind = spec.get("type")
    if kind == "string":
        return str
    if kind == "integer":
        return int
    if kind == "number":
        return float
    if kind == "boolean":
        return bool
    if kind == "null":
        return type(None)
    if kind == "array":
        return list[_annotation(spec.get("items", {}), defs, cache, f"{name}_item")]
    if kind == "object":
        if "properties" in spec:
            return _object_model(name, spec, defs, cache)
        return dict[str, Any]
    return Any


class SchemaTool:
    """A tool whose schema is given (not derived) and whose body is a Python handler.

    The handler receives the validated arguments as keyword arguments (nested objects as dicts).
    """
    def __init__(self, schema: ToolSchema, handler: Callable[..., Any]):
        self.schema = schema
        self.kind = schema.kind
        self.name = schema.name
        self.fn = handler
        self.args_model = args_model_from_schema(schema)

    def __call__(self, arguments: dict[str, Any]) -> Any:
        parsed = self.args_model.model_validate(arguments)
        values = parsed.model_dump(mode="json")
        return self.fn(**{k: values[k] for k in type(parsed).model_fields if k in arguments or values[k] is not None})


def add_schema_tool(toolbox: Toolbox, schema: ToolSchema, handler: Callable[..., Any]) -> None:
    """Give `toolbox` one more tool with exactly this schema (name, parameters, kind)."""
    toolbox._tools[schema.name] = SchemaTool(schema, handler)  # type: ignore[assignment]
