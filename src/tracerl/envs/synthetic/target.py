"""The target a synthetic environment imitates, as the environment sees it: the target's tool
schemas, its system prompt's lines, its domain rules, and examples of its values, results and
users' requests (`tracerl.synthesis.target` builds one from a domain; target.json, the file
`tracerl.contracts.TargetFile`, keeps it in an environment directory).

`tool_families` pairs each read ("check") tool with the write ("act") tools that take the same id
parameter — e.g. get_order_details(order_id) with cancel_pending_order(order_id, reason) — which
is what every capability template is built from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tracerl.contracts import TargetFile
from tracerl.core.tools import ToolSchema, tools_json


@dataclass(frozen=True)
class Target:
    name: str  # "airline", "retail", …
    tools: tuple[ToolSchema, ...]
    title: str  # first line of the target's system prompt, e.g. "# Retail agent policy" (policy.md's title)
    source: str  # "airline" (built-in) or the tools.json path it was read from
    preamble: tuple[str, ...] = ()  # the target prompt's lines before its domain rules (title included)
    closing: tuple[str, ...] = ()  # its lines after the domain rules
    rules: tuple[str, ...] = ()  # its domain rules ("Cancel: …"), for templates that ask its own requests
    value_examples: dict[str, list[str]] | None = None  # parameter -> string values the target uses
    result_examples: dict[str, dict[str, Any]] | None = None  # tool -> one JSON object it returned
    # write tool -> [{"request": the user's words, each value said as "{parameter}",
    #                 "record": the record it was made on, as the check tool returned it,
    #                 "user": the user's record there, "allowed": whether the target's rules allowed it,
    #                 "write": the write {name, arguments} that serves it}] (see `request_examples`)
    request_examples: dict[str, list[dict[str, Any]]] | None = None
    policy: str = ""  # the domain's policy text, whole (preamble, rules and closing come from it)

    def tool(self, name: str) -> ToolSchema:
        for t in self.tools:
            if t.name == name:
                return t
        raise KeyError(name)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Target:
        """The target in target.json's content, checked by its contract (`tracerl.contracts.TargetFile`);
        LLM-written environment modules read their target.json with it."""
        return cls.of_file(TargetFile.model_validate(data))

    @classmethod
    def of_file(cls, file: TargetFile) -> Target:
        return cls(name=file.name, tools=tuple(ToolSchema.from_openai(t) for t in file.tools), title=file.title,
                   source=file.source, preamble=tuple(file.preamble), closing=tuple(file.closing),
                   value_examples=file.value_examples or None, result_examples=file.result_examples or None,
                   request_examples=file.request_examples or None, rules=tuple(file.rules), policy=file.policy)

    def file(self) -> TargetFile:
        """target.json's content."""
        return TargetFile(name=self.name, title=self.title, source=self.source, preamble=list(self.preamble),
                          closing=list(self.closing), value_examples=self.value_examples or {},
                          result_examples=self.result_examples or {}, request_examples=self.request_examples or {},
                          rules=list(self.rules), policy=self.policy, tools=tools_json(list(self.tools)))


def request_parameters(request: str) -> set[str]:
    """The parameters a request example states: {"reservation_id"} for 'cancel reservation {reservation_id}'."""
    return set(re.findall(r"\{(\w+)\}", request))


def fill_request(request: str, arguments: dict[str, Any]) -> str:
    """A request example with these arguments' values in its "{parameter}" places."""
    for name, value in arguments.items():
        request = request.replace("{" + name + "}", str(value))
    return request


@dataclass(frozen=True)
class ToolFamily:
    """A read tool and the write tools that take the same id parameter (simplest first)."""

    check: ToolSchema
    acts: tuple[ToolSchema, ...]
    id_param: str

    @property
    def entity(self) -> str:
        return self.id_param.removesuffix("_id")


def tool_families(tools: tuple[ToolSchema, ...] | list[ToolSchema]) -> list[ToolFamily]:
    """Every (check, acts) family, largest family first; acts ordered simplest first. A check tool is a
    read tool whose one required parameter is an id (get_order_details(order_id)), or, where it
    requires none, one that can be asked by an id its acts require (ToolSandBox's
    search_contacts(person_id=…) with remove_contact(person_id))."""
    families = []
    for check in tools:
        if check.kind != "read":
            continue
        required = check.parameters.get("required", [])
        if len(required) == 1 and required[0].endswith("_id"):
            candidates = required
        elif not required:
            candidates = [p for p, spec in check.parameters.get("properties", {}).items()
                          if p.endswith("_id") and _is_string(spec)]
        else:
            continue
        for id_param in candidates:
            acts = [
                t for t in tools
                if t.kind == "write" and id_param in t.parameters.get("required", [])
                and _is_string(t.parameters.get("properties", {}).get(id_param, {}))
            ]
            if acts:
                acts.sort(key=lambda t: (argument_complexity(t), t.name))
                families.append(ToolFamily(check=check, acts=tuple(acts), id_param=id_param))
    families.sort(key=lambda f: (-len(f.acts), f.check.name))
    return families


def _is_string(spec: dict[str, Any]) -> bool:
    return spec.get("type") == "string"


def argument_complexity(schema: ToolSchema) -> int:
    """How hard a call is to write: scalars count 1, arrays of scalars 2, nested objects 4 per field."""
    defs = schema.parameters.get("$defs", {})

    def cost(spec: dict[str, Any]) -> int:
        if "$ref" in spec:
            spec = defs.get(spec["$ref"].split("/")[-1], {})
        kind = spec.get("type")
        if kind == "array":
            inner = spec.get("items", {})
            return 2 if inner.get("type") in ("string", "integer", "number", "boolean") else 4 * max(1, cost(inner))
        if kind == "object":
            return sum(cost(v) for v in spec.get("properties", {}).values()) or 1
        return 1

    return sum(cost(v) for v in schema.parameters.get("properties", {}).values())


def is_flat(schema: ToolSchema) -> bool:
    """All parameters are scalars or arrays of scalars (no nested objects)."""
    for spec in schema.parameters.get("properties", {}).values():
        if "$ref" in spec or spec.get("type") == "object":
            return False
        if spec.get("type") == "array" and spec.get("items", {}).get("type") not in ("string", "integer", "number", "boolean"):
            return False
    return True
