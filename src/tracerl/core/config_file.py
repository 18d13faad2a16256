"""Read a YAML config into a pydantic model; a bad key or value is one line naming file and line.

YAML is read with `UniqueKeyLoader`: a key given twice in one mapping is refused (naming both lines),
where PyYAML would keep the last one silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error, read_text

M = TypeVar("M", bound=BaseModel)


class DuplicateKey(yaml.constructor.ConstructorError):
    pass


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names a key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: the constructor below says so
                continue
            if first != key_node.start_mark.line + 1:
                raise DuplicateKey(None, None, f"key '{key}' is given twice (lines {first} and "
                                               f"{key_node.start_mark.line + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, path: str | Path) -> Any:
    """The document in `text` (YAML, duplicate keys refused); a problem is one `InputError` with its line."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 — a SafeLoader subclass
    except yaml.reader.ReaderError as e:  # a character YAML does not allow
        line = text[: e.position].count("\n") + 1 if isinstance(e.position, int) else None
        raise InputError(f"not valid YAML (character {e.character!r} is not allowed)", path=str(path), line=line) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise InputError(f"not valid YAML ({problem})", path=str(path), line=None if mark is None else mark.line + 1) from None
    except RecursionError:
        raise InputError("YAML nested too deeply", path=str(path)) from None


def load_yaml(path: str | Path) -> tuple[dict[str, Any], yaml.Node | None]:
    """The mapping in a YAML file, and its node tree (for line numbers)."""
    path = Path(path)
    text = read_text(path, "config file")
    data = parse_yaml(text, path)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        node = None
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
