"""A benchmark's own code in a process of its own: one JSON request per line on its stdin, one JSON
answer per line on its stdout (`{"ok": true, …}` or `{"ok": false, "error": "…"}`, with the
request's `id`).

A live target whose benchmark needs other library versions than tracerl (ToolSandBox pins numpy
1.26 and transformers 4.41) runs its side of the episode as a script (e.g.
`toolsandbox_bridge.py`) under the Python of its own virtual environment; `BridgeProcess` starts
it, sends requests one at a time (a lock makes it thread-safe) and keeps what it writes on stderr
in a log file, whose path errors name.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from tracerl.core.errors import InputError


class BridgeError(RuntimeError):
    """An error the benchmark's process reported for one request."""


class BridgeProcess:
    """`python script` answering requests in order. `name` names the benchmark in errors; `hint` says
    how to install it."""

    def __init__(self, script: Path, python: str, *, name: str, hint: str, env: dict[str, str] | None = None):
        self.name, self.hint, self.python = name, hint, python
        self.workdir = tempfile.mkdtemp(prefix=f"tracerl-{script.stem}-")  # the benchmark may write under its cwd
        self.log_path = Path(self.workdir) / "bridge.log"
        self._log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen([python, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, env={**os.environ, **(env or {})}, cwd=self.workdir,
                                         text=True, encoding="utf-8")
        except OSError as e:
            self._log.close()
            raise InputError(f"cannot run {name}'s Python '{python}' ({e.strerror}); {hint}") from None
        self._lock = threading.Lock()
        self._count = 0

    def request(self, op: str, **payload: Any) -> dict[str, Any]:
        with self._lock:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}'s process ended (exit {self.proc.returncode}); log: {self.log_path}")
            assert self.proc.stdin and self.proc.stdout
            self._count += 1
            self.proc.stdin.write(json.dumps({"op": op, "id": self._count, **payload}, ensure_ascii=False) + "\n")
            self.proc.stdin.flush()
            while True:  # skip answers to requests abandoned mid-way (an interrupt)
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"{self.name}'s process ended without an answer; log: {self.log_path}")
                answer = json.loads(line)
                if answer.pop("id", None) == self._count:
                    break
        if not answer.pop("ok"):
            raise BridgeError(answer["error"])
        return answer

    def hello(self) -> dict[str, Any]:
        """The first request: the benchmark imports. One line naming the Python when it does not."""
        try:
            return self.request("hello")
        except BridgeError as e:
            self.close()
            raise InputError(f"{self.name} is not installed for {self.python} ({e}); {self.hint}") from None
        except RuntimeError:
            self.close()
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise InputError(f"{self.python} could not run {self.name}'s side ({tail[0][:300]}); {self.hint}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()
