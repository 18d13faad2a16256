"""LLM-written environments run in a confined worker process, and only there.

`SandboxWorker(folder, module)` copies the module and its target.json into a throw-away folder and
starts `python -m tracerl.envs.synthetic.sandbox_worker` on it:

- with a clean environment (PATH, LANG, HOME and TMPDIR = the folder; no API keys, no proxies), no
  inherited file descriptors but its two pipes and its stderr file, in a session (process group) of
  its own, in a fresh network namespace where `unshare --user --net` works;
- with resource limits (`WorkerLimits`): CPU seconds over its life, address space, file size, open
  files, no core dumps; and a wall-clock limit on every call, past which it is killed;
- confined by the kernel before any generated code runs (`tracerl.core.confine`: Landlock
  reads and writes to its folder and the interpreter's files, seccomp no processes and no sockets). Where
  the kernel offers neither Landlock nor seccomp, the module is not run unless the user set
  TRACERL_ALLOW_UNCONFINED_GENERATED_CODE=1 (`tracerl --allow-unconfined-generated-code`).

The parent talks to it over a pipe, in length-prefixed JSON frames it reads with a size limit and a
deadline, and believes nothing it is told: every reply is validated (`SandboxedEnv`: messages,
rewards finite and in [0, 1], tool results answering the calls made), and text from the worker is
scrubbed and bounded (`tracerl.core.untrusted`) before anyone sees it. A `SandboxedEnv` is an `Env`
like any other, so checks, calibration, training, gate data and evaluation play generated
environments through it and never import them. When the worker ends (closed, garbage-collected,
at exit, or killed for a limit), its whole process group is killed and its folder removed.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from tracerl.core.errors import InputError
from tracerl.core.messages import Action, Message
from tracerl.core.tools import ToolSchema
from tracerl.core.untrusted import untrusted_text
from tracerl.envs.base import Env, StepResult
from tracerl.core.confine import REQUIRED

ALLOW_UNCONFINED = "TRACERL_ALLOW_UNCONFINED_GENERATED_CODE"  # "1": run generated code where the kernel cannot confine it
_HEADER = struct.Struct(">I")
_ERROR_CHARS = 1500
CONFINED = "the sandbox allows no processes, no sockets and no files outside the module's own folder"  # the most of one error text from the worker that is kept


@dataclass(frozen=True)
class WorkerLimits:
    cpu_seconds: int = 3600  # CPU time over the worker's life (RLIMIT_CPU)
    memory_bytes: int = 2 << 30  # address space (RLIMIT_AS)
    call_seconds: float = 60.0  # wall-clock time of one call (import, reset, step, …)
    file_bytes: int = 16 << 20  # largest file it may write (RLIMIT_FSIZE)
    open_files: int = 256
    reply_bytes: int = 8 << 20  # largest reply read back


class SandboxFailure(RuntimeError):
    """The worker is gone: killed for a limit, crashed, or broke the protocol (one line, why)."""


class GeneratedCodeError(RuntimeError):
    """The generated code raised, or answered something that is not what the `Env` protocol allows."""


class ConfinementUnavailable(InputError):
    """The kernel cannot confine generated code, and the user did not opt out of confinement."""


def allow_unconfined() -> bool:
    return os.environ.get(ALLOW_UNCONFINED) == "1"


def check_confinement(layers: Sequence[str], source: str) -> None:
    """Refuse to run `source` when a required layer is missing, unless the user opted in (then warn loudly)."""
    missing = [layer for layer in REQUIRED if layer not in layers]
    if not missing:
        return
    if not allow_unconfined():
        raise ConfinementUnavailable(
            f"this kernel cannot confine generated code (missing: {', '.join(missing)}), so it is not run; "
            f"to run it anyway with your user's access to files and network, pass --allow-unconfined-generated-code "
            f"(or set {ALLOW_UNCONFINED}=1)", path=source)
    sys.stderr.write(f"WARNING: running generated code {source} WITHOUT confinement (missing: {', '.join(missing)}) "
                     f"because {ALLOW_UNCONFINED}=1: it can read your files and reach the network\n")


@lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """Whether `unshare --user --map-root-user --net` works here (unprivileged user namespaces)."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        done = subprocess.run([exe, "--user", "--map-root-user", "--net", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@lru_cache(maxsize=1)
def kernel_confinement() -> tuple[str, ...]:
    """The confinement layers this machine's kernel gives a process (`confine` tried in a throw-away
    child process); generated code runs without the opt-in when they include `REQUIRED`."""
    with tempfile.TemporaryDirectory(prefix="tracerl-probe-") as tmp:
        code = ("import json, sys; from pathlib import Path; from tracerl.core.confine import confine; "
                "print(json.dumps(confine(Path(sys.argv[1]))))")
        try:
            done = subprocess.run([sys.executable, "-I", "-c", code, tmp], capture_output=True, text=True, timeout=60)
            layers = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
            layers = []
    return tuple(layers)


def _end(proc: subprocess.Popen, fds: list[int], tmp: str) -> None:
    """Kill the worker's process group, close the pipes, remove its folder (idempotent)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass
    shutil.rmtree(tmp, ignore_errors=True)


class SandboxWorker:
    """One confined worker process hosting one environment module (module docstring)."""

    def __init__(self, folder: str | Path, module: str, *, files: Sequence[str] = ("target.json",),
                 limits: WorkerLimits | None = None, deadline: tuple[float, float] | None = None,
                 source: str | None = None):
        """Start a worker on a copy of `folder/module` and `files`; `deadline` = (monotonic time, seconds):
        a wall-clock limit on the worker's whole life (a check run's)."""
        self.limits = limits or WorkerLimits()
        self.deadline = deadline
        self.source = source or str(Path(folder) / module)
        self.failure: str | None = None
        self.isolation: list[str] = []
        self._lock = threading.Lock()
        self._dropped: list[int] = []
        self._tmp = tempfile.mkdtemp(prefix="tracerl-sandbox-")
        work = Path(self._tmp) / "env"
        work.mkdir()
        for name in (module, *files):
            if (Path(folder) / name).is_file():
                shutil.copyfile(Path(folder) / name, work / name)
        self._stderr_path = Path(self._tmp) / "stderr"
        request_r, self._request_w = os.pipe2(os.O_CLOEXEC)
        self._reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
        rlimits = {"cpu": max(1, int(self.limits.cpu_seconds)), "memory": self.limits.memory_bytes,
                   "file": self.limits.file_bytes, "open_files": self.limits.open_files}
        command = [sys.executable, "-I", "-m", "tracerl.envs.synthetic.sandbox_worker", str(work), module,
                   str(request_r), str(reply_w), json.dumps(rlimits)]
        isolation = ["rlimits", "call wall-clock", "throw-away folder", "clean environment", "own process group"]
        if network_namespace_available():
            command = [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--net", *command]
            isolation.append("network namespace")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work), "TMPDIR": str(work),
               "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        try:
            with open(self._stderr_path, "wb") as err:
                self._proc = subprocess.Popen(command, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=err, pass_fds=(request_r, reply_w),
                                              start_new_session=True)
        finally:
            os.close(request_r)
            os.close(reply_w)
        self._fds = [self._request_w, self._reply_r]
        self._finalizer = weakref.finalize(self, _end, self._proc, self._fds, self._tmp)
        hello = self._exchange(None, "start-up")
        layers = hello.get("layers") if isinstance(hello, dict) else None
        if not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
            self._fail("the worker did not report its confinement")
        self.isolation = isolation + layers
        try:
            check_confinement(layers, self.source)
        except ConfinementUnavailable:
            self.close()
            raise

    # --- the pipe --------------------------------------------------------------------------------
    def _timeout(self, what: str) -> tuple[float, str]:
        call = self.limits.call_seconds
        if self.deadline is not None:
            start, seconds = self.deadline
            left = start + seconds - time.monotonic()
            if left < call:
                return max(0.0, left), f"killed: ran past the wall-clock limit of {seconds:g} s"
        return call, f"killed: {what} ran past the wall-clock limit of {call:g} s for one call"

    def _fail(self, reason: str) -> None:
        self.failure = self.failure or reason
        self._finalizer()
        raise SandboxFailure(self.failure)

    def _died(self) -> str:
        """Why the worker ended, from its exit status (and whether it ran out of memory)."""
        try:
            rc = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        try:
            with open(self._stderr_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self._stderr_path) - 4096))
                tail = f.read().decode("utf-8", "replace")
        except OSError:
            tail = ""
        if rc == -signal.SIGXCPU and "MemoryError" not in tail:
            return f"killed: ran past the CPU-time limit of {self.limits.cpu_seconds} s"
        if rc == -signal.SIGKILL and "MemoryError" not in tail:  # the CPU limit's hard end, or the kernel's OOM killer
            return f"killed (SIGKILL): past the CPU-time limit of {self.limits.cpu_seconds} s, or out of memory"
        if rc == -signal.SIGXFSZ:
            return f"killed: wrote a file larger than {self.limits.file_bytes} bytes"
        if "MemoryError" in tail:
            return self._out_of_memory()
        if rc is not None and rc < 0:
            return f"killed by signal {signal.Signals(-rc).name}"
        return f"exited with code {rc}"

    def _out_of_memory(self) -> str:
        return f"ran out of memory (limit {self.limits.memory_bytes >> 20} MiB)"

    def _exchange(self, request: dict[str, Any] | None, what: str) -> Any:
        """Send `request` (None: only read) and read one reply frame, within the call's time."""
        if self.failure is not None:
            raise SandboxFailure(self.failure)
        timeout, late = self._timeout(what)
        end = time.monotonic() + timeout
        if request is not None:
            drops = []
            while self._dropped:  # pop() is atomic: a finalizer may append meanwhile, on any thread
                drops.append(self._dropped.pop())
            if drops:
                request["drop"] = drops
            body = json.dumps(request).encode()
            if not self._send(_HEADER.pack(len(body)) + body, end):
                self._fail(late if time.monotonic() >= end else self._died())
        header = self._receive(_HEADER.size, end, late)
        (size,) = _HEADER.unpack(header)
        if size > self.limits.reply_bytes:
            self._fail(f"answered {size} bytes to {what} (limit {self.limits.reply_bytes})")
        body = self._receive(size, end, late)
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            self._fail(f"answered {what} with something that is not JSON")

    def _send(self, data: bytes, end: float) -> bool:
        view = memoryview(data)
        while view:
            left = end - time.monotonic()
            if left <= 0:
                return False
            _, writable, _ = select.select([], [self._request_w], [], left)
            if not writable:
                return False
            try:
                view = view[os.write(self._request_w, view[: 1 << 16]):]
            except (BrokenPipeError, OSError):
                return False
        return True

    def _receive(self, n: int, end: float, late: str) -> bytes:
        chunks, got = [], 0
        while got < n:
            left = end - time.monotonic()
            readable = select.select([self._reply_r], [], [], left)[0] if left > 0 else []
            if not readable:
                self._fail(late)
            chunk = os.read(self._reply_r, min(n - got, 1 << 20))
            if not chunk:
                self._fail(self._died())
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def request(self, request: dict[str, Any], what: str) -> Any:
        """One request and its reply's value; a call that raised in the module is a `GeneratedCodeError`."""
        with self._lock:
            reply = self._exchange(request, what)
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            self._fail(f"answered {what} out of protocol")
        if reply["ok"]:
            return reply.get("value")
        if reply.get("fatal") or reply.get("error") == "MemoryError":
            self._fail(self._out_of_memory())
        error, where = reply.get("error"), reply.get("where")
        text = untrusted_text(error if isinstance(error, str) else "an error it did not describe", _ERROR_CHARS,
                              one_line=True)
        if isinstance(where, str):
            text += f" (at {untrusted_text(where, 100, one_line=True)})"
        if text.startswith("PermissionError"):
            text += f" — {CONFINED}"
        raise GeneratedCodeError(text)

    def drop(self, handle: int) -> None:
        self._dropped.append(handle)

    # --- the module ------------------------------------------------------------------------------
    def load(self) -> None:
        """Import the module (runs its top-level code) and find `make_env`."""
        self.request({"op": "load"}, "importing the module")

    def factory(self, difficulty: int) -> SandboxedEnvFactory:
        return SandboxedEnvFactory(self, difficulty)

    @property
    def alive(self) -> bool:
        return self.failure is None and self._finalizer.alive

    def close(self) -> None:
        """Kill the worker's process group and remove its folder."""
        self._finalizer()


class SandboxedEnvFactory:
    """A zero-argument factory of `SandboxedEnv`s at one difficulty, all in one worker."""

    def __init__(self, worker: SandboxWorker, difficulty: int):
        self.worker = worker
        self.difficulty = difficulty

    def __call__(self) -> SandboxedEnv:
        value = self.worker.request({"op": "new", "difficulty": self.difficulty}, "make_env")
        try:
            made = _Made.model_validate(value)
        except ValidationError as e:
            raise GeneratedCodeError(f"make_env: {_first_problem(e)}") from None
        return SandboxedEnv(self.worker, made.id, name=made.name, max_turns=made.max_turns,
                            difficulty=self.difficulty)

    def at(self, difficulty: int) -> SandboxedEnvFactory:
        return SandboxedEnvFactory(self.worker, difficulty)

    def close(self) -> None:
        self.worker.close()


# --- what a reply may hold -----------------------------------------------------------------------
class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Made(_Reply):
    id: int
    name: str
    max_turns: int

    @field_validator("name")
    @classmethod
    def _short(cls, v: str) -> str:
        if not 0 < len(v) <= 200:
            raise ValueError("the env's name must have 1 to 200 characters")
        return v

    @field_validator("max_turns")
    @classmethod
    def _turns(cls, v: int) -> int:
        if not 1 <= v <= 10_000:
            raise ValueError("max_turns must be between 1 and 10000")
        return v


class _ResetReply(_Reply):
    messages: list[dict[str, Any]]
    info: dict[str, Any]


class _StepReply(_Reply):
    messages: list[dict[str, Any]]
    reward: float | int
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def _first_problem(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "the value"
    return untrusted_text(f"returned a bad {where}: {err['msg']}", 300, one_line=True)


def _messages(raw: list[dict[str, Any]], what: str) -> list[Message]:
    try:
        return [Message.model_validate(m) for m in raw]
    except ValidationError as e:
        raise GeneratedCodeError(f"{what} {_first_problem(e)}") from None


class SandboxedEnv(Env):
    """An environment living in a `SandboxWorker`: each call is a request, each reply is checked.

    What the worker answers must be what the `Env` protocol allows: reset gives at least one message
    and no tool results; step answers an assistant message with tool results for the calls it made
    (by their ids) or the user's reply, a finite reward in [0, 1] and booleans; a finished episode is
    not stepped again (refused here, not asked). Anything else is a `GeneratedCodeError`.
    """

    def __init__(self, worker: SandboxWorker, handle: int, *, name: str, max_turns: int, difficulty: int):
        self.worker = worker
        self.handle = handle
        self.name = name
        self.max_turns = max_turns
        self.difficulty = difficulty
        self._done = True
        weakref.finalize(self, worker.drop, handle)

    def _call(self, method: str, *args: Any) -> Any:
        return self.worker.request({"op": "call", "id": self.handle, "method": method, "args": list(args)},
                                   f"{method}()")

    @property
    def tools(self) -> list[ToolSchema]:
        value = self._call("tools")
        try:
            return [ToolSchema.model_validate(t) for t in _list(value, "tools")]
        except ValidationError as e:
            raise GeneratedCodeError(f"tools {_first_problem(e)}") from None

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        seed = 0 if seed is None else int(seed)
        try:
            reply = _ResetReply.model_validate(self._call("reset", seed, dict(options or {})))
        except ValidationError as e:
            raise GeneratedCodeError(f"reset {_first_problem(e)}") from None
        messages = _messages(reply.messages, "reset")
        if not messages:
            raise GeneratedCodeError("reset returned no messages")
        if any(m.role == "tool" for m in messages):
            raise GeneratedCodeError("reset returned a tool result before any call")
        self._done = False
        return messages, reply.info

    def step(self, message: Message) -> StepResult:
        if self._done:
            raise RuntimeError("step() after the episode ended; call reset()")
        if message.role != "assistant":
            raise ValueError(f"step() takes an assistant message, got role '{message.role}'")
        try:
            reply = _StepReply.model_validate(self._call("step", message.model_dump()))
        except ValidationError as e:
            raise GeneratedCodeError(f"step {_first_problem(e)}") from None
        messages = _messages(reply.messages, "step")
        reward = float(reply.reward)
        if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
            raise GeneratedCodeError(f"step returned the reward {reward!r}, not a number in [0, 1]")
        calls = {c.id for c in message.tool_calls or []}
        for m in messages:
            if m.role not in ("tool", "user"):
                raise GeneratedCodeError(f"step returned a '{m.role}' message (only tool results and the user's reply)")
            if m.role == "tool" and m.tool_call_id not in calls:
                raise GeneratedCodeError("step returned a tool result for a call the agent did not make")
        info = reply.info
        breakdown = info.get("reward_breakdown", {})
        if not isinstance(breakdown, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for k, v in breakdown.items()):
            raise GeneratedCodeError("step returned a reward_breakdown that is not a mapping of names to numbers")
        if not isinstance(info.get("termination", ""), (str, type(None))):
            raise GeneratedCodeError("step returned a termination that is not a string")
        self._done = reply.terminated or reply.truncated
        return messages, reward, reply.terminated, reply.truncated, info

    def oracle(self, seed: int) -> list[Action]:
        value = self._call("oracle", int(seed))
        try:
            return [Action.model_validate(a) for a in _list(value, "oracle")]
        except ValidationError as e:
            raise GeneratedCodeError(f"oracle {_first_problem(e)}") from None

    def hint(self, seed: int) -> str | None:
        value = self._call("hint", int(seed))
        if value is not None and not isinstance(value, str):
            raise GeneratedCodeError("hint returned something that is not text")
        return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise GeneratedCodeError(f"{what} returned something that is not a list")
    return value
