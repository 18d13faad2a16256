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


def read_text(path: str | Path, what: str = "file") -> str:
    """A UTF-8 text file's content; a missing file, a folder, an unreadable or undecodable file is one
    `InputError` naming it (`what`: what the file should have been, e.g. "config file")."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"no such {what}", path=str(path)) from None
    except IsADirectoryError:
        raise InputError(f"is a folder, not a {what}", path=str(path)) from None
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1 if isinstance(e.object, bytes) else None
        raise InputError(f"not a UTF-8 text file (byte {e.object[e.start]:#04x} at offset {e.start})", path=str(path),
                         line=line) from None
    except OSError as e:
        raise InputError(f"cannot read it ({e.strerror or type(e).__name__})", path=str(path)) from None


def parse_json(text: str, path: str | Path) -> Any:
    """`json.loads` with a one-line `InputError` naming file, line and column (and nesting too deep)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON ({e.msg}, column {e.colno})", path=str(path), line=e.lineno) from None
    except RecursionError:
        raise InputError("JSON nested too deeply", path=str(path)) from None


def check_output(path: str | Path, *, folder: bool, what: str = "--out") -> Path:
    """Check, before any work, that `path` can be written as a file (`folder=False`) or a folder: it is
    not the other kind already, nothing on the way is a file, and its nearest existing folder takes a
    new file (tried for real, then removed). Returns the path; a problem is one `InputError`."""
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise InputError(f"{what}: is a file, not a folder", path=str(path))
    if not folder and path.is_dir():
        raise InputError(f"{what}: is a folder, not a file", path=str(path))
    parent = path if folder else path.parent
    existing = parent
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise InputError(f"{what}: {existing} is a file, so nothing can be written under it", path=str(path))
    if path.exists() and not folder and not os.access(path, os.W_OK):
        raise InputError(f"{what}: the file is not writable", path=str(path))
    try:
        fd, probe = tempfile.mkstemp(prefix=".tracerl-write-check.", dir=existing)
    except OSError as e:
        raise InputError(f"{what}: cannot write in {existing} ({e.strerror or type(e).__name__})", path=str(path)) from None
    os.close(fd)
    os.unlink(probe)
    return path


def write_json(path: str | Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def read_json(path: str | Path) -> Any:
    return parse_json(read_text(path), path)


def write_jsonl(path: str | Path, records: Iterable[BaseModel]) -> None:
    """One record per line, keys in model order: same records ⇒ byte-identical file."""
    lines = [r.model_dump_json(exclude_none=False) + "\n" for r in records]
    atomic_write_text(path, "".join(lines))


def read_jsonl(path: str | Path, model: type[M]) -> list[M]:
    path = Path(path)
    text = read_text(path)
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON ({e.msg}, column {e.colno})", path=str(path), line=lineno) from None
        except RecursionError:
            raise InputError("JSON nested too deeply", path=str(path), line=lineno) from None
        try:
            records.append(model.model_validate(data))
        except ValidationError as e:
            raise InputError(describe_validation_error(e), path=str(path), line=lineno) from None
        except RecursionError:
            raise InputError("a record nested too deeply", path=str(path), line=lineno) from None
    return records


def describe_validation_error(e: ValidationError) -> str:
    """The first problem of a pydantic error, in one line: `field.path: message`."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "record"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    if err["type"] == "missing":
        return f"missing field '{where}'{more}"
    return f"field '{where}': {err['msg']}{more}"
