"""Tool schemas: an OpenAI function schema plus the τ²-bench kind (read / write / generic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tracerl.core.errors import InputError
from tracerl.core.io import read_json

ToolKind = Literal["read", "write", "generic"]


class ToolSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    kind: ToolKind = "generic"

    def to_openai(self) -> dict[str, Any]:
        """The `tools=[…]` entry of the OpenAI API and of `apply_chat_template`."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @classmethod
    def from_openai(cls, entry: dict[str, Any]) -> ToolSchema:
        """Read one entry of a tools.json as τ²-bench exports it (`x-tool-type` gives the kind)."""
        function = entry.get("function", entry)
        kind = entry.get("x-tool-type", function.get("x-tool-type", "generic"))
        return cls(
            name=function["name"],
            description=function.get("description", ""),
            parameters=function.get("parameters", {"type": "object", "properties": {}}),
            kind=kind if kind in ("read", "write", "generic") else "generic",
        )

    def parameter_signature(self) -> dict[str, Any]:
        """What interface fidelity compares: parameter names, their types and which are required."""
        props = self.parameters.get("properties", {})
        return {
            "properties": {name: _type_of(spec, self.parameters.get("$defs", {})) for name, spec in props.items()},
            "required": sorted(self.parameters.get("required", [])),
        }


def _type_of(spec: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A schema's type with descriptions and titles stripped, `$ref`s resolved."""
    if "$ref" in spec:
        return _type_of(defs.get(spec["$ref"].split("/")[-1], {}), defs)
    if "anyOf" in spec:
        return {"anyOf": [_type_of(s, defs) for s in spec["anyOf"]]}
    out: dict[str, Any] = {"type": spec.get("type", "any")}
    if "enum" in spec:
        out["enum"] = sorted(map(str, spec["enum"]))
    if spec.get("type") == "array":
        out["items"] = _type_of(spec.get("items", {}), defs)
    if spec.get("type") == "object" and "properties" in spec:
        out["properties"] = {k: _type_of(v, defs) for k, v in spec["properties"].items()}
    return out


def tools_json(tools: list[ToolSchema]) -> list[dict[str, Any]]:
    """A domain's tools as a tools.json holds them (what `load_tools_json` reads back): OpenAI function
    entries with the kind as `x-tool-type`, as τ²-bench exports them."""
    return [{**t.to_openai(), "x-tool-type": t.kind} for t in tools]


def load_tools_json(path: str | Path) -> list[ToolSchema]:
    """Load a domain's tools from a tools.json like τ²-bench's (a list of OpenAI function entries)."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, list):
        raise InputError("expected a JSON list of tool entries", path=str(path))
    tools = []
    for i, entry in enumerate(data):
        try:
            tools.append(ToolSchema.from_openai(entry))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InputError(f"tool entry {i} is malformed ({type(e).__name__}: {e})", path=str(path)) from None
    return tools
