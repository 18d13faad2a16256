"""Run a command on a copy of a repository, sandboxed: the code domain's shell and its grader.

`run_in_copy(files, argv)` writes `files` (path → text) into a fresh folder, runs `argv` there and
reads the files back. The command runs with

- resource limits (`resource.setrlimit`): CPU seconds, address space, file size, open files, no
  core dumps; and a wall-clock timeout after which its whole process group is killed;
- no network: a fresh network namespace (`unshare --user --map-root-user --net`), and Landlock
  denies TCP bind and connect;
- writes confined to the copy: Landlock (`tracerl.core.confine.landlock`) lets it write only under
  the sandbox's own folder (the job's repository copy and its TMPDIR/HOME beside it), inherited by
  every child;
- a clean environment: PATH, HOME, TMPDIR, LANG, PYTHONDONTWRITEBYTECODE and
  PYTEST_DISABLE_PLUGIN_AUTOLOAD only, no keys or proxies.

The jobs of one process go to one fork server (`python -I -m tracerl.envs.code.fork_server`, started
on first use inside the network namespace and confined by Landlock): each job is a child forked from it, so a
command starts in milliseconds, and `run_pytest` runs pytest in the forked child with pytest already
loaded — the same program as `python -m pytest ARGS` in that folder, without the interpreter's
start-up (≈0.1 s a run instead of ≈0.7 s here).

Where the kernel lacks user namespaces or Landlock, `isolation()` says which layer is missing and
`run_in_copy` raises `SandboxUnavailable`: nothing an agent writes runs outside the sandbox.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from functools import lru_cache

from tracerl.core.confine import network_namespace_available


class SandboxUnavailable(RuntimeError):
    """This machine cannot confine a command (no user namespaces or no Landlock)."""


@dataclass(frozen=True)
class ShellLimits:
    wall_seconds: float = 20.0
    cpu_seconds: int = 20
    memory_bytes: int = 1 << 30  # address space
    file_bytes: int = 4 << 20
    open_files: int = 256
    output_chars: int = 4000


@dataclass
class CommandResult:
    returncode: int
    output: str  # stdout and stderr interleaved, cut to `output_chars`
    files: dict[str, str]  # the copy's text files after the command
    timed_out: bool = False


@lru_cache(maxsize=1)
def isolation() -> tuple[str, ...]:
    """The isolation layers this machine gives a command: 'network namespace', 'landlock'."""
    layers = ["network namespace"] if network_namespace_available() else []
    with tempfile.TemporaryDirectory(prefix="tracerl-confine-") as tmp:
        done = subprocess.run([sys.executable, "-I", "-m", "tracerl.core.confine", tmp, "true"], capture_output=True,
                              timeout=30)
        if done.returncode == 0:
            layers.append("landlock")
    return tuple(layers)


ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8",
       "PYTHONHASHSEED": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # pytest's own plugins only: half its start-up


class _Server:
    """The fork server of this process (see the module docstring); one job at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.root: str | None = None
        self.owner = os.getpid()

    def start(self) -> None:
        layers = isolation()
        if len(layers) < 2:
            missing = {"network namespace", "landlock"} - set(layers)
            raise SandboxUnavailable(f"cannot sandbox a command here: no {' and no '.join(sorted(missing))}")
        self.root = tempfile.mkdtemp(prefix="tracerl-code-")
        command = [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--net",
                   sys.executable, "-I", "-m", "tracerl.envs.code.fork_server", self.root]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env={**ENV, "HOME": self.root, "TMPDIR": self.root}, text=True, bufsize=1,
                                     start_new_session=True)
        self.owner = os.getpid()

    def stop(self) -> None:
        if self.proc is not None and self.owner == os.getpid():
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        if self.root is not None and self.owner == os.getpid():
            shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def run(self, job: dict) -> dict:
        with self.lock:
            for attempt in range(2):
                if self.proc is None or self.proc.poll() is not None or self.owner != os.getpid():
                    self.proc = None
                    self.start()
                try:
                    assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
                    self.proc.stdin.write(json.dumps(job) + "\n")
                    self.proc.stdin.flush()
                    line = self.proc.stdout.readline()
                    if line:
                        return json.loads(line)
                except (BrokenPipeError, OSError):
                    pass
                self.stop()
            raise RuntimeError("the sandbox's fork server stopped answering")


_SERVER = _Server()
atexit.register(_SERVER.stop)


def _job(files: dict[str, str], limits: ShellLimits, **command: object) -> CommandResult:
    answer = _SERVER.run({"files": files, "limits": asdict(limits), "env": ENV, **command})
    output = answer["output"]
    if len(output) > limits.output_chars:
        output = output[: limits.output_chars] + "\n[output cut]"
    if answer["timed_out"]:
        output += f"\n[killed: ran past {limits.wall_seconds:g} s]"
    elif answer["returncode"] == -24:  # SIGXCPU
        output += f"\n[killed: ran past {limits.cpu_seconds} s of CPU time]"
    return CommandResult(answer["returncode"], output, answer["files"], answer["timed_out"])


def run_in_copy(files: dict[str, str], argv: list[str], limits: ShellLimits = ShellLimits()) -> CommandResult:
    """Run `argv` in a sandboxed copy of `files` (see the module docstring); never raises for what the
    command does — a time-out or a kill comes back as its return code and a line in the output."""
    return _job(files, limits, argv=list(argv))


def run_pytest(files: dict[str, str], args: list[str], limits: ShellLimits = ShellLimits()) -> CommandResult:
    """`python -m pytest ARGS` in a sandboxed copy of `files`, pytest run in the forked child."""
    return _job(files, limits, pytest=list(args))


PYTEST_COMMAND = re.compile(r"^\s*python3?\s+-m\s+pytest((?:\s+[\w./:=\[\]-]+)*)\s*$")


def pytest_arguments(command: str) -> list[str] | None:
    """The arguments of a shell command that is exactly `python -m pytest [ARGS]` (plain words, no
    quoting, redirection or chaining), else None."""
    match = PYTEST_COMMAND.match(command)
    return None if match is None else match.group(1).split()


_DURATION = re.compile(r" in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?(?= *=*$)", re.MULTILINE)


def without_durations(text: str) -> str:
    """pytest's closing line without its wall time ('2 passed in 0.03s' → '2 passed'): the same
    command on the same files then prints the same text."""
    return _DURATION.sub("", text)
