"""The child side of the sandbox: lock the process down, import the module, run the checks.

    python -I -m tracerl.synthesis.sandbox_worker <folder> <seeds> <difficulty>

Everything this process needs (tracerl, pydantic) is imported *before* the lock-down; then:
Landlock (where the kernel has it, `tracerl.core.confine.landlock`) makes the file system read-only except `<folder>`, denies TCP
bind/connect and (ABI ≥ 6) signals to processes outside; a Python audit hook — which cannot be
removed — refuses sockets, subprocesses, exec, fork, kill, ctypes loading and opening files for
writing outside `<folder>`. Then `<folder>/env.py` is imported and `make_env(difficulty)` checked.
The report is printed as one line after `REPORT_MARKER`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from tracerl.core.confine import landlock
from tracerl.core.io import read_json
from tracerl.envs.synthetic.checks import validate_env
from tracerl.envs.synthetic.envdir import MODULE_PY, TARGET_JSON, load_module_factory
from tracerl.envs.synthetic.target import Target
from tracerl.synthesis.sandbox import REPORT_MARKER

_BLOCKED_EVENTS = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "os.kill", "os.killpg", "signal.pthread_kill", "ctypes.", "pty.spawn", "webbrowser")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def install_audit_hook(writable: Path) -> None:
    """Refuse network, processes, signals, ctypes and writes outside `writable` (irremovable)."""
    root = str(writable.resolve())

    def hook(event: str, args: tuple) -> None:
        if event.startswith(_BLOCKED_EVENTS):
            raise PermissionError(f"sandbox: '{event}' is not allowed")
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing and isinstance(path, (str, bytes, os.PathLike)):
                target = os.path.realpath(os.fsdecode(path))
                if target != os.devnull and not (target == root or target.startswith(root + os.sep)):
                    raise PermissionError(f"sandbox: writing '{target}' outside the module's folder is not allowed")
        elif event in ("os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "shutil.rmtree",
                       "os.truncate", "os.chmod", "os.chown", "os.utime"):
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)):
                    target = os.path.realpath(os.fsdecode(path))
                    if not (target == root or target.startswith(root + os.sep)):
                        raise PermissionError(f"sandbox: '{event}' on '{target}' outside the module's folder is not allowed")

    sys.addaudithook(hook)


def _emit(payload: dict) -> None:
    sys.stdout.write("\n" + REPORT_MARKER + json.dumps(payload) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    folder, seeds, difficulty = Path(argv[0]).resolve(), int(argv[1]), int(argv[2])
    target = Target.from_json(read_json(folder / TARGET_JSON))
    layers = landlock(folder)
    install_audit_hook(folder)
    try:
        make_env = load_module_factory(folder / MODULE_PY)
        report = validate_env(lambda: make_env(difficulty), target.tools, seeds=range(seeds))
    except MemoryError:
        _emit({"error": "ran out of memory", "isolation": layers})
        return 1
    except BaseException as e:  # noqa: BLE001 — anything the module does is reported, not raised
        frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        where = f" (at {Path(frame.filename).name}:{frame.lineno})" if frame else ""
        _emit({"error": f"import failed: {type(e).__name__}: {e}{where}", "isolation": layers})
        return 1
    _emit({"report": report.model_dump(), "isolation": layers})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
