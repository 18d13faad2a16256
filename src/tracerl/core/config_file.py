"""Read a YAML config into a pydantic model; a bad key or value is one line naming file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error

M = TypeVar("M", bound=BaseModel)


def load_yaml(path: str | Path) -> tuple[dict[str, Any], yaml.Node | None]:
    """The mapping in a YAML file, and its node tree (for line numbers)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError("no such config file", path=str(path)) from None
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(f"not valid YAML ({getattr(e, 'problem', e)})", path=str(path),
                         line=None if mark is None else mark.line + 1) from None
    if data is None:
        return {}, node
    if not isinstance(data, dict):
        raise InputError("a config must be a mapping of option: value", path=str(path), line=1)
    return data, node


def line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the deepest key of `loc` found in a composed YAML node tree."""
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    line, node = key.start_mark.line + 1, value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def validate_config(model: type[M], data: dict[str, Any], *, path: str | Path | None = None,
                    node: yaml.Node | None = None) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        loc = tuple(e.errors()[0]["loc"])
        raise InputError(describe_validation_error(e), path=None if path is None else str(path),
                         line=line_of(node, loc)) from None


def load_config_file(model: type[M], path: str | Path, overrides: dict[str, Any] | None = None) -> M:
    data, node = load_yaml(path)
    data.update(overrides or {})
    return validate_config(model, data, path=path, node=node)
