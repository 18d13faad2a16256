"""Files: atomic writes and JSONL of pydantic records with one-line errors naming file and line."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from tracerl.core.errors import InputError

M = TypeVar("M", bound=BaseModel)
_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary name in the same folder, then rename: readers never see half a file."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError("no such file", path=str(path)) from None
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", path=str(path)) from None
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON ({e.msg}, column {e.colno})", path=str(path), line=e.lineno) from None


def write_jsonl(path: str | Path, records: Iterable[BaseModel]) -> None:
    """One record per line, keys in model order: same records ⇒ byte-identical file."""
    lines = [r.model_dump_json(exclude_none=False) + "\n" for r in records]
    atomic_write_text(path, "".join(lines))


def read_jsonl(path: str | Path, model: type[M]) -> list[M]:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError("no such file", path=str(path)) from None
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", path=str(path)) from None
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON ({e.msg}, column {e.colno})", path=str(path), line=lineno) from None
        try:
            records.append(model.model_validate(data))
        except ValidationError as e:
            raise InputError(describe_validation_error(e), path=str(path), line=lineno) from None
    return records


def describe_validation_error(e: ValidationError) -> str:
    """The first problem of a pydantic error, in one line: `field.path: message`."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "record"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    if err["type"] == "missing":
        return f"missing field '{where}'{more}"
    return f"field '{where}': {err['msg']}{more}"
