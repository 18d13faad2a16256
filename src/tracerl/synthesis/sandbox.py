"""Validate an untrusted environment module in a sandboxed subprocess.

The module (an LLM wrote it) is copied with its target.json into a throw-away folder and checked
by `tracerl.synthesis.sandbox_worker` in a child process that has:

- resource limits (`resource.setrlimit`): CPU seconds, address space, file size, open files,
  no core dumps; plus a wall-clock timeout after which the whole process group is killed;
- no network: a fresh network namespace (`unshare --user --net`) where available, and inside the
  child Landlock denies TCP bind/connect and a Python audit hook refuses every socket;
- a file system it can read but not write, except the module's own (throw-away) folder, which is
  also its working directory, HOME and TMPDIR (Landlock, where the kernel has it, and the audit
  hook in any case); no subprocesses, no signals to other processes;
- a clean environment: no API keys or proxies are passed on.

`run_in_sandbox` never raises for what the module does: every outcome (checks failed, crash,
time-out, memory exhausted, forbidden operation) comes back in a `SandboxResult`.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tracerl.contracts import CheckReport
from tracerl.core.confine import network_namespace_available

REPORT_MARKER = "TRACERL-SANDBOX-REPORT "


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 60
    memory_bytes: int = 2 << 30  # address space
    wall_seconds: float = 120.0
    file_bytes: int = 16 << 20
    open_files: int = 256
    seeds: int = 20
    difficulty: int = 1


@dataclass
class SandboxResult:
    ok: bool  # every check passed
    error: str | None = None  # why it did not (one line), when not a failed check
    report: CheckReport | None = None
    isolation: list[str] = field(default_factory=list)  # the layers that were active
    stderr_tail: str = ""

    def summary(self) -> str:
        if self.ok:
            return "all checks passed"
        if self.report is not None and not self.report.passed:
            return self.report.failures()
        return self.error or "failed"


def _limit_child(limits: SandboxLimits):
    def apply() -> None:
        cpu = max(1, int(limits.cpu_seconds))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_in_sandbox(module_dir: str | Path, limits: SandboxLimits | None = None) -> SandboxResult:
    """Check the env module in `module_dir` (env.py + target.json) in a sandboxed child process."""
    limits = limits or SandboxLimits()
    module_dir = Path(module_dir)
    with tempfile.TemporaryDirectory(prefix="tracerl-sandbox-") as tmp:
        work = Path(tmp) / "env"
        shutil.copytree(module_dir, work)
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        command = [sys.executable, "-I", "-m", "tracerl.synthesis.sandbox_worker", str(work),
                   str(limits.seeds), str(limits.difficulty)]
        isolation = ["rlimits", "wall-clock", "throw-away folder", "audit hook"]
        if network_namespace_available():
            command = [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--net", *command]
            isolation.append("network namespace")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work), "TMPDIR": str(work),
               "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    preexec_fn=_limit_child(limits), start_new_session=True)
            timed_out = False
            try:
                proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
        stdout = out_path.read_bytes().decode("utf-8", "replace")
        stderr = err_path.read_bytes().decode("utf-8", "replace")
    return _interpret(proc.returncode, timed_out, stdout, stderr, limits, isolation)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _interpret(rc: int, timed_out: bool, stdout: str, stderr: str, limits: SandboxLimits,
               isolation: list[str]) -> SandboxResult:
    tail = stderr[-2000:]
    payload = None
    for line in reversed(stdout.splitlines()):
        if line.startswith(REPORT_MARKER):
            try:
                payload = json.loads(line[len(REPORT_MARKER):])
            except json.JSONDecodeError:
                payload = None
            break
    if payload is not None:
        layers = isolation + list(payload.get("isolation", []))
        if payload.get("error"):
            return SandboxResult(ok=False, error=payload["error"], isolation=layers, stderr_tail=tail)
        report = CheckReport.model_validate(payload["report"])
        return SandboxResult(ok=report.passed, report=report, isolation=layers, stderr_tail=tail)
    if timed_out:
        error = f"killed: ran past the wall-clock limit of {limits.wall_seconds:g} s"
    elif rc == -signal.SIGXCPU or rc == -signal.SIGKILL and "MemoryError" not in stderr:
        error = f"killed: ran past the CPU-time limit of {limits.cpu_seconds} s" if rc == -signal.SIGXCPU else "killed (SIGKILL)"
    elif rc == -signal.SIGXFSZ:
        error = f"killed: wrote a file larger than {limits.file_bytes} bytes"
    elif "MemoryError" in stderr:
        error = f"ran out of memory (limit {limits.memory_bytes >> 20} MiB)"
    elif rc < 0:
        error = f"killed by signal {signal.Signals(-rc).name}"
    else:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
        error = f"exited with code {rc} without a report: {last}"
    return SandboxResult(ok=False, error=error, isolation=isolation, stderr_tail=tail)
