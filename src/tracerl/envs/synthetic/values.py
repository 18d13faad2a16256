"""Seeded argument values that look like the target's: ids shaped like the schema's examples.

A parameter described as "The order id, such as '#W0000000'" gets ids like '#W4829301'; one
described as "either 'no longer needed' or 'ordered by mistake'" gets one of the two; enums
are respected; dates are valid dates. Everything comes from the caller's `random.Random`.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

Examples = Mapping[str, Sequence[str]]  # parameter name -> values seen in the target (e.g. its gold actions)

from tracerl.core.tools import ToolSchema

_QUOTED = re.compile(r"'([^']*)'")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_WORD_CODE = re.compile(r"^[a-z]+(?:_[a-z]+)*$")  # 'wren_amber', 'wren': a code made of words


def examples_of(description: str) -> list[str]:
    """The quoted example values of a parameter description ("such as 'X'", "either 'a' or 'b'")."""
    found = [q for q in _QUOTED.findall(description or "") if q and q != "YYYY-MM-DD"]
    return found


def choices_of(description: str) -> list[str] | None:
    """Closed choices stated in a description: "either 'a' or 'b'" / "should be 'a' or 'b'"."""
    match = re.search(r"(either|should be|must be|one of)\s+((?:'[^']*'(?:,\s*|\s+or\s+)?)+)", description or "")
    if not match:
        return None
    options = _QUOTED.findall(match.group(2))
    return options if len(options) >= 2 else None


def shaped_like(example: str, rng: random.Random) -> str:
    """A fresh value with the example's shape: digits → random digits; letters too when the example
    is a bare code ('ZFA04Y'), kept when it has separators ('sara_doe_496', '#W0000000')."""
    if _DATE.match(example):
        return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    bare = example.isalnum() and any(c.isdigit() for c in example)
    out = []
    for ch in example:
        if ch.isdigit():
            out.append(rng.choice(string.digits))
        elif bare and ch.isupper():
            out.append(rng.choice(string.ascii_uppercase))
        elif bare and ch.islower():
            out.append(rng.choice(string.ascii_lowercase))
        else:
            out.append(ch)
    value = "".join(out)
    if value == example and not any(c.isdigit() for c in example):
        return example  # a fixed word ('USA', 'Apt 1'): keep it
    return value


def word_code(examples: Sequence[str], rng: random.Random) -> str:
    """A code of words like the examples ('wren_amber', 'oak_ruby' → 'oak_amber'): each word drawn
    from the words the examples have in that position, no word twice."""
    parts = [e.split("_") for e in examples]
    size = rng.choice([len(p) for p in parts])
    words: list[str] = []
    for position in range(size):
        pool = sorted({p[position] for p in parts if len(p) > position} - set(words))
        if not pool:
            break
        words.append(rng.choice(pool))
    return "_".join(words)


def id_value(spec: dict[str, Any], name: str, rng: random.Random, seen: Examples | None = None) -> str:
    """An identifier for parameter `name` shaped like a value the target uses (`seen`), else like its
    description's example."""
    if seen and seen.get(name):
        values = list(seen[name])
        if all(_WORD_CODE.match(v) for v in values):
            return word_code(values, rng)
        return shaped_like(rng.choice(values), rng)
    examples = [e for e in examples_of(spec.get("description", "")) if any(c.isalnum() for c in e)]
    if examples:
        value = shaped_like(rng.choice(examples), rng)
        if any(c.isdigit() for c in value):
            return value
    return f"{name.removesuffix('_id')}_{rng.randint(1000, 9999)}"


def sample_value(spec: dict[str, Any], name: str, rng: random.Random, defs: dict[str, Any] | None = None,
                 seen: Examples | None = None) -> Any:
    """A valid value for a parameter schema (resolving $ref/anyOf), seeded by `rng`; string values are
    shaped like the target's own values of that parameter (`seen`) when there are any."""
    defs = defs or {}
    if "$ref" in spec:
        spec = {**defs.get(spec["$ref"].split("/")[-1], {}), "description": spec.get("description", "")}
    if "anyOf" in spec:
        options = [s for s in spec["anyOf"] if s.get("type") != "null"] or spec["anyOf"]
        return sample_value(options[0], name, rng, defs, seen)
    if "enum" in spec:
        return rng.choice(list(spec["enum"]))
    kind = spec.get("type")
    description = spec.get("description", "")
    if kind == "string":
        choices = choices_of(description)
        if choices:
            return rng.choice(choices)
        if seen and seen.get(name):
            return shaped_like(rng.choice(list(seen[name])), rng)
        if name.endswith("_id") or "such as" in description:
            examples = examples_of(description)
            if examples:
                return shaped_like(rng.choice(examples), rng)
        return f"{name}_{rng.randint(100, 999)}"
    if kind == "integer":
        return rng.choice([50, 100, 150, 200, 250]) if "amount" in name else rng.randint(1, 5)
    if kind == "number":
        return round(rng.uniform(1, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        item_name = name[:-1] if name.endswith("s") else name
        items = dict(spec.get("items", {}))
        items.setdefault("description", description)  # "The item ids …, each such as '1008292230'"
        return [sample_value(items, item_name, rng, defs, seen) for _ in range(rng.randint(1, 2))]
    if kind == "object":
        props = spec.get("properties", {})
        return {k: sample_value(v, k, rng, defs, seen) for k, v in props.items()}
    return f"{name}_{rng.randint(100, 999)}"


def sample_arguments(schema: ToolSchema, rng: random.Random, fixed: dict[str, Any] | None = None,
                     seen: Examples | None = None) -> dict[str, Any]:
    """Values for every required parameter of `schema`; `fixed` ones (e.g. the id) are given."""
    fixed = fixed or {}
    params = schema.parameters
    defs = params.get("$defs", {})
    out: dict[str, Any] = {}
    for pname in params.get("required", list(params.get("properties", {}))):
        if pname in fixed:
            out[pname] = fixed[pname]
        else:
            out[pname] = sample_value(params["properties"][pname], pname, rng, defs, seen)
    return out
