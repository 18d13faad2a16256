"""The code domain's fork server: confined jobs, one JSON object per line of stdin.

    python -I -m tracerl.envs.code.fork_server ROOT

started by `tracerl.envs.code.sandbox` inside a fresh network namespace. It first confines itself
with Landlock (`tracerl.core.confine.landlock(ROOT, None)`: file writes only under ROOT, no TCP bind or connect,
no signals outside) — a restriction every child inherits — exiting 126 with one line on stderr
where the kernel has none. Then it runs pytest once on an empty folder (so its built-in plugins
are loaded) and answers jobs: each names `files` (path → text), `argv` or `pytest` arguments,
`limits` and `env`; the answer is one JSON line (`returncode`, `output`, `files`, `timed_out`). A
job's files are written into a fresh folder under ROOT; a forked child sets the job's resource
limits, starts its own session and runs the command there — a `pytest` job runs `pytest.main` in
the child, the interpreter and pytest already loaded, any other `os.execvp`s — and the child's
whole process group is killed past the wall-clock limit; the files are read back and the folder
deleted. When stdin closes (its parent stopped or died) it empties ROOT and exits.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from tracerl.core.confine import landlock

SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".git"}
MAX_FILE_BYTES = 256 << 10


def write_files(root: str, files: dict) -> None:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def read_files(root: str) -> dict:
    """The UTF-8 text files under `root` (caches, links, oversized and binary files left out)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    out[os.path.relpath(path, root).replace(os.sep, "/")] = f.read()
            except (UnicodeDecodeError, OSError):
                continue
    return out


def _child(job: dict, repo: str, scratch: str, output: str) -> None:
    """In the forked child: limits, own session, output to the file, then the command. Never returns."""
    try:
        os.setsid()
        limits = job["limits"]
        cpu = max(1, int(limits["cpu_seconds"]))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.chdir(repo)
        env = dict(job["env"], HOME=scratch, TMPDIR=scratch)
        os.environ.clear()
        os.environ.update(env)
        if job.get("pytest") is not None:  # pytest is loaded already: no start-up
            sys.path.insert(0, repo)  # as `python -m pytest` puts the working folder first
            sys.argv = ["pytest", *job["pytest"]]
            code = pytest.main(list(job["pytest"]))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(code))
        os.execvp(job["argv"][0], job["argv"])
    except BaseException as e:  # noqa: BLE001 — whatever failed, the job's answer says so
        try:
            os.write(2, f"sandbox: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(127)


def _warm(root: str) -> None:
    """Run pytest once on an empty folder, output discarded, so that the modules of its built-in
    plugins are loaded in the server and every forked job finds them loaded."""
    folder = os.path.join(root, "warm")
    os.makedirs(folder)
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        pytest.main(["-q", "-rA", "-p", "no:cacheprovider", folder])
    finally:
        sys.stdout.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        shutil.rmtree(folder, ignore_errors=True)


def serve(root: str) -> None:
    _warm(root)
    count = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        count += 1
        folder = os.path.join(root, f"job{count}")
        repo, scratch, output = os.path.join(folder, "repo"), os.path.join(folder, "tmp"), os.path.join(folder, "output")
        os.makedirs(repo)
        os.makedirs(scratch)
        write_files(repo, job["files"])
        pid = os.fork()
        if pid == 0:
            _child(job, repo, scratch, output)
        deadline = time.monotonic() + float(job["limits"]["wall_seconds"])
        timed_out, status = False, 0
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                timed_out = True
                os.killpg(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.002)
        try:
            os.killpg(pid, signal.SIGKILL)  # what the command left running in its session
        except (ProcessLookupError, PermissionError):
            pass
        limit = int(job["limits"]["output_chars"]) * 4
        with open(output, "rb") as f:
            text = f.read(limit + 1)
        answer = {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out,
                  "output": text.decode("utf-8", "replace"), "files": read_files(repo)}
        shutil.rmtree(folder, ignore_errors=True)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    for name in os.listdir(root):  # stdin closed (the parent stopped, or died): leave nothing behind
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -I -m tracerl.envs.code.fork_server ROOT\n")
        sys.exit(2)
    if not landlock(Path(sys.argv[1]), None):
        sys.stderr.write("fork server: Landlock is not available on this kernel\n")
        sys.exit(126)
    serve(sys.argv[1])
