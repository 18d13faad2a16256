"""Stage caching for a run's workspace: skip a stage whose outputs are complete and inputs unchanged.

A stage declares the paths it reads (workspace-relative, or absolute for files outside it such as a
capabilities file), the paths it writes and the config it runs with: the whole config objects it is
given (a `View`), so a field cannot be left out of its key. After it succeeds, `.stages/<name>.json`
records a fingerprint of (that config, the contents of every input). On the next run the stage is
skipped when that record exists, its fingerprint still matches and every output exists. The record
is written last, so a run killed at any moment redoes (or, for resumable stages, resumes) only the
stage it was in.
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


def fingerprint(workspace: Path, stage: Stage) -> str:
    h = hashlib.sha256()
    h.update(stage.name.encode())
    h.update(json.dumps(stage.config, sort_keys=True, default=str).encode())
    for rel in sorted(stage.inputs):
        h.update(b"\0" + rel.encode())
        path = workspace / rel  # an absolute `rel` stays itself
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if not f.exists() or f.name.startswith(".") or "checkpoint" in f.parts:
                continue
            h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def is_complete(workspace: Path, stage: Stage) -> bool:
    record_path = workspace / ".stages" / f"{stage.name}.json"
    if not record_path.exists():
        return False
    record = read_json(record_path)
    return record.get("fingerprint") == fingerprint(workspace, stage) and all(
        (workspace / out).exists() for out in stage.outputs
    )


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
    write_json(record_path, {
        "fingerprint": fingerprint(workspace, stage),
        "seconds": round(time.time() - start, 2),
        "summary": summary,
    })
    return True, summary
