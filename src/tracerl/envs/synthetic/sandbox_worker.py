"""The child side of the sandbox: confine this process, then host one environment module's envs.

    python -I -m tracerl.envs.synthetic.sandbox_worker <folder> <module file> <request fd> <reply fd> <rlimits JSON>

Everything the worker and the usual environment modules need is imported first; then its resource
limits (CPU seconds, address space, file size, open files, no core dumps), `confine.confine(folder)`
(Landlock, seccomp, process limit), and one frame `{"layers": [...]}` says
which layers hold — before any generated code has run, so the parent can still refuse it. Each
request frame is then answered with one reply frame (`tracerl.envs.synthetic.sandbox`):

    {"op": "load"}                                    import the module, find make_env
    {"op": "new", "difficulty": d}                    make_env(d) → {"id", "name", "max_turns"}
    {"op": "call", "id": i, "method": m, "args": […]} tools | reset | step | oracle | hint of env i
    any request: "drop": [ids]                        forget those envs first

A reply is `{"ok": true, "value": …}` or `{"ok": false, "error": "Type: message", "where": "env.py:12"}`.
Nothing here is trusted by the parent: once the module is imported it owns this process, and the
parent checks every reply it reads.
"""

from __future__ import annotations

import collections  # noqa: F401 — what environment modules commonly import, loaded before confinement
import copy  # noqa: F401
import dataclasses  # noqa: F401
import datetime  # noqa: F401
import functools  # noqa: F401
import hashlib  # noqa: F401
import importlib.util
import itertools  # noqa: F401
import json
import math  # noqa: F401
import os
import random  # noqa: F401
import re  # noqa: F401
import resource
import string  # noqa: F401
import struct
import sys
import traceback
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import tracerl.envs.synthetic.values  # noqa: F401 — the helpers the module contract offers
from tracerl.core.messages import Message
from tracerl.envs.base import Env
from tracerl.core.confine import confine
from tracerl.envs.synthetic.target import Target  # noqa: F401
from tracerl.envs.tools import Toolbox  # noqa: F401

_HEADER = struct.Struct(">I")
_MAX_REQUEST = 64 << 20


def read_frame(fd: int) -> Any:
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > _MAX_REQUEST:
        raise ValueError(f"request of {size} bytes")
    body = _read_exactly(fd, size)
    if body is None:
        return None
    return json.loads(body)


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def encode(value: Any) -> bytes:
    return json.dumps(value, default=_jsonable, ensure_ascii=False).encode("utf-8", "replace")


def write_frame(fd: int, body: bytes) -> None:
    data = _HEADER.pack(len(body)) + body
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def import_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("tracerl_generated_env", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    make_env = getattr(module, "make_env", None)
    if not callable(make_env):
        raise AttributeError(f"{path.name} defines no make_env(difficulty)")
    return make_env


class Host:
    """The module's envs, by id, and the requests on them."""

    def __init__(self, module_path: Path):
        self.module_path = module_path
        self.make_env: Any = None
        self.envs: dict[int, Env] = {}
        self.next_id = 0

    def handle(self, request: dict[str, Any]) -> Any:
        for i in request.get("drop", ()):
            self.envs.pop(i, None)
        op = request["op"]
        if op == "load":
            self.make_env = import_module(self.module_path)
            return None
        if op == "new":
            if self.make_env is None:
                raise RuntimeError("the module is not loaded")
            env = self.make_env(int(request["difficulty"]))
            self.next_id += 1
            self.envs[self.next_id] = env
            return {"id": self.next_id, "name": getattr(env, "name", "env"), "max_turns": getattr(env, "max_turns", 30)}
        if op == "call":
            return self.call(self.envs[request["id"]], request["method"], request.get("args", []))
        raise ValueError(f"unknown op {op!r}")

    @staticmethod
    def call(env: Env, method: str, args: list[Any]) -> Any:
        if method == "tools":
            return [t.model_dump() for t in env.tools]
        if method == "reset":
            seed, options = args
            messages, info = env.reset(seed=seed, options=options)
            return {"messages": [m.model_dump() for m in messages], "info": info}
        if method == "step":
            messages, reward, terminated, truncated, info = env.step(Message.model_validate(args[0]))
            return {"messages": [m.model_dump() for m in messages], "reward": reward, "terminated": terminated,
                    "truncated": truncated, "info": info}
        if method == "oracle":
            return [a.model_dump() for a in env.oracle(args[0])]
        if method == "hint":
            return env.hint(args[0])
        raise ValueError(f"unknown method {method!r}")


def _where(e: BaseException, module_path: Path) -> str | None:
    """The innermost frame of the module itself that the exception passed through (a SyntaxError
    names its line itself)."""
    if isinstance(e, SyntaxError):
        return None
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ else []
    ours = [f for f in frames if f.filename == str(module_path)] or frames[-1:]
    return f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else None


def _describe(e: BaseException) -> str:
    try:
        return f"{type(e).__name__}: {e}"
    except Exception:  # noqa: BLE001 — an exception whose str() raises
        return type(e).__name__


def set_limits(limits: dict[str, int]) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu"], limits["cpu"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory"], limits["memory"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file"], limits["file"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: list[str]) -> int:
    folder, module, request_fd, reply_fd = Path(argv[0]).resolve(), argv[1], int(argv[2]), int(argv[3])
    set_limits(json.loads(argv[4]))
    layers = confine(folder)
    write_frame(reply_fd, encode({"layers": layers}))
    host = Host(folder / module)
    while True:
        request = read_frame(request_fd)
        if request is None:  # the parent closed the pipe (or died): nothing left to do
            return 0
        try:
            reply = encode({"ok": True, "value": host.handle(request)})
        except MemoryError:
            reply = encode({"ok": False, "error": "MemoryError", "fatal": True})
        except BaseException as e:  # noqa: BLE001 — whatever the module raises is reported, the loop goes on
            reply = encode({"ok": False, "error": _describe(e), "where": _where(e, host.module_path)})
        write_frame(reply_fd, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
