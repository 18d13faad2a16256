"""Confinement primitives the sandboxes share: Landlock and the network-namespace probe.

- `landlock(writable)` restricts the calling process, and every child it starts, with Landlock
  (Linux ≥ 5.13): file writes only under `writable` (and /dev/null); from ABI 4 no TCP bind or
  connect; from ABI 6 no signals to processes outside and no abstract UNIX sockets outside. It
  returns the layers set up (`[]` where the kernel has no Landlock: nothing was restricted).
- `network_namespace_available()`: whether `unshare --user --map-root-user --net` works here (a
  fresh network namespace with no interface but loopback, for an unprivileged user).

Users: the synthesis sandbox's worker (`tracerl.synthesis.sandbox_worker`) and the code domain's
fork server (`tracerl.envs.code.fork_server`). Run as a module it confines itself, then runs a
command — `python -I -m tracerl.core.confine FOLDER COMMAND [ARG…]` — exiting 126 with one line on
stderr where the kernel has no Landlock; the code domain's sandbox probes the kernel with it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

# linux/landlock.h
_FS_WRITE = (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12)
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock(writable: str | Path) -> list[str]:
    """Restrict this process (and its future children) with Landlock; the layers it set up."""
    if not sys.platform.startswith("linux"):
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return []
    fs = _FS_WRITE | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(handled_access_fs=fs, handled_access_net=(_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0,
                        scoped=(_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return []
    for path in (Path(writable), Path("/dev/null")):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        allowed = fs if path.is_dir() else (1 << 1) | ((1 << 14) if abi >= 3 else 0)
        rule = _PathBeneathAttr(allowed_access=allowed, parent_fd=fd)
        added = libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0))
        os.close(fd)
        if added != 0:
            os.close(ruleset)
            return []
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 \
            or libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        os.close(ruleset)
        return []
    os.close(ruleset)
    return ["landlock fs"] + (["landlock net"] if abi >= 4 else []) + (["landlock signal scope"] if abi >= 6 else [])


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


def main(argv: list[str]) -> int:
    """`FOLDER COMMAND [ARG…]`: confine this process to writing under FOLDER, then become COMMAND."""
    if len(argv) < 2:
        sys.stderr.write("usage: python -m tracerl.core.confine FOLDER COMMAND [ARG…]\n")
        return 2
    if not landlock(argv[0]):
        sys.stderr.write("confine: Landlock is not available on this kernel\n")
        return 126
    os.execvp(argv[1], argv[1:])
    return 127  # not reached: execvp replaces the process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
