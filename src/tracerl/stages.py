"""Stage caching for a run's workspace: skip a stage whose outputs are complete and inputs unchanged.

A stage declares the paths it reads (workspace-relative, or absolute for files outside it such as a
capabilities file), the paths it writes and the config it runs with: the whole config objects it is
given (a `View`), so a field cannot be left out of its key. After it succeeds, `.stages/<name>.json`
records a fingerprint of (that config, the content of every file it reads — every file inside an
input folder, none left out), with the config and the per-file digests it was made of. On the next
run the stage is skipped when that record exists, its fingerprint still matches and every output
exists; otherwise `stale_reasons` says why it runs again (which config field, which input file, which
output). The record is written last, so a run killed at any moment redoes (or, for resumable stages,
resumes) only the stage it was in.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tracerl.core.io import read_json, write_json


@dataclass
class Stage:
    name: str
    run: Callable[[], dict[str, Any] | None]  # returns a summary for the record (optional)
    inputs: list[str] = field(default_factory=list)  # files or folders, workspace-relative or absolute
    outputs: list[str] = field(default_factory=list)
    config: Any = None  # the JSON-able config this stage runs with (`View.key()`)


class View:
    """The sections of a config one stage reads, as attributes; any other section is an AttributeError.

    A stage function is given only its view, and the stage's key is every field of every section in it.
    """

    def __init__(self, config: BaseModel, sections: list[str]):
        self.__dict__.update({name: getattr(config, name) for name in sections})

    def key(self) -> dict[str, Any]:
        return {name: value.model_dump(mode="json") if isinstance(value, BaseModel) else value
                for name, value in self.__dict__.items()}


Files = dict[str, list[tuple[str, str, str | None]]]  # input → (key, name within it, sha256 or None) per file


def read_inputs(workspace: Path, stage: Stage) -> Files:
    """Every file the stage reads, with its sha256: an input file by its name, each file inside an
    input folder as `folder/relative/path`; an input that does not exist has the digest None. Nothing
    is left out."""
    files: Files = {}
    for rel in sorted(stage.inputs):
        path = workspace / rel  # an absolute `rel` stays itself
        if path.is_dir():
            files[rel] = [(f"{rel.rstrip('/')}/{f.relative_to(path).as_posix()}", str(f.relative_to(path)), _sha256(f))
                          for f in sorted(p for p in path.rglob("*") if p.is_file())]
        else:
            files[rel] = [(rel, path.name, _sha256(path) if path.is_file() else None)]
    return files


def input_digests(files: Files) -> dict[str, str | None]:
    return {key: digest for entries in files.values() for key, _, digest in entries}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fingerprint(workspace: Path, stage: Stage, files: Files | None = None) -> str:
    """sha256 over the stage's name, its config and the content of every file it reads (`files`:
    `read_inputs`' result, when already computed)."""
    files = read_inputs(workspace, stage) if files is None else files
    h = hashlib.sha256()
    h.update(stage.name.encode())
    h.update(json.dumps(stage.config, sort_keys=True, default=str).encode())
    for rel, entries in files.items():
        h.update(b"\0" + rel.encode())
        for _, name, digest in entries:
            if digest is not None:
                h.update(name.encode())
                h.update(bytes.fromhex(digest))
    return h.hexdigest()


def is_complete(workspace: Path, stage: Stage) -> bool:
    return not stale_reasons(workspace, stage)


def stale_reasons(workspace: Path, stage: Stage) -> list[str]:
    """Why the stage must run ([] when it is complete): never ran, which config fields and which
    inputs changed since its record, which outputs are missing."""
    record_path = workspace / ".stages" / f"{stage.name}.json"
    if not record_path.exists():
        return ["it has not run to the end"]
    record = read_json(record_path)
    files = read_inputs(workspace, stage)
    reasons = []
    if record.get("fingerprint") != fingerprint(workspace, stage, files):
        before_config, before_inputs = record.get("config"), record.get("inputs")
        if not isinstance(before_config, dict) or not isinstance(before_inputs, dict):
            reasons.append("its record does not say what it ran with")
        else:
            reasons += config_changes(before_config, json.loads(json.dumps(stage.config, default=str)))
            reasons += input_changes(before_inputs, input_digests(files))
            if not reasons:
                reasons.append("its fingerprint changed")
    reasons += [f"output {out} is missing" for out in stage.outputs if not (workspace / out).exists()]
    return reasons


def config_changes(before: Any, now: Any, prefix: str = "") -> list[str]:
    """'config <dotted field>: <old> → <new>' for each field that differs."""
    if isinstance(before, dict) and isinstance(now, dict):
        out = []
        for key in sorted(before.keys() | now.keys(), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in now:
                out.append(f"config {name} is gone")
            elif key not in before:
                out.append(f"config {name} is new ({_short(now[key])})")
            else:
                out += config_changes(before[key], now[key], name)
        return out
    if before != now:
        return [f"config {prefix or 'value'}: {_short(before)} → {_short(now)}"]
    return []


def input_changes(before: dict[str, Any], now: dict[str, str | None]) -> list[str]:
    """'input <file> changed / is new / is gone' for each file read that differs."""
    out = []
    for name in sorted(before.keys() | now.keys()):
        old, new = before.get(name), now.get(name)
        if old == new:
            continue
        if old is None:
            out.append(f"input {name} is new")
        elif new is None:
            out.append(f"input {name} is gone")
        else:
            out.append(f"input {name} changed")
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_stage(workspace: Path, stage: Stage, *, force: bool = False) -> tuple[bool, dict[str, Any]]:
    """Run `stage` unless it is complete; returns (ran, summary)."""
    record_path = workspace / ".stages" / f"{stage.name}.json"
    if not force and is_complete(workspace, stage):
        return False, read_json(record_path).get("summary", {})
    record_path.unlink(missing_ok=True)
    start = time.time()
    summary = stage.run() or {}
    missing = [out for out in stage.outputs if not (workspace / out).exists()]
    if missing:
        raise RuntimeError(f"stage '{stage.name}' finished without writing {', '.join(missing)}")
    write_record(workspace, stage, summary=summary, seconds=round(time.time() - start, 2))
    return True, summary


def write_record(workspace: Path, stage: Stage, *, summary: dict[str, Any], seconds: float = 0.0) -> None:
    """`.stages/<name>.json`: the fingerprint, and the config and input digests it was made of (what
    `stale_reasons` compares a later run with)."""
    files = read_inputs(workspace, stage)
    write_json(workspace / ".stages" / f"{stage.name}.json", {
        "fingerprint": fingerprint(workspace, stage, files),
        "seconds": seconds,
        "summary": summary,
        "config": stage.config,
        "inputs": input_digests(files),
    })
