"""Kernel confinement of the current process, for running code no one reviewed (Linux only).

`confine(folder, readable)` applies, irrevocably, to this process and everything it could start:

- Landlock (ABI ≥ 1): the file system is unreadable except `folder` (readable and writable) and the
  `readable` paths (the interpreter's own files); nothing else can be written, created or removed;
  ABI ≥ 4 also denies TCP bind/connect, ABI ≥ 6 signals and abstract UNIX sockets outside;
- seccomp: no new processes (fork, vfork, clone without CLONE_THREAD, clone3, execve), no sockets, no
  ptrace or reading another process's memory, no io_uring, namespaces, mounts, BPF or keyrings, and
  signals only to itself — each refused with EPERM (clone3: ENOSYS, so threads fall back to clone);
- RLIMIT_NPROC 1 where it counts (not for root, whom the kernel exempts; seccomp holds there).

It returns the layers it set up; one missing (no Landlock in this kernel, an architecture seccomp's
filter is not written for) is left out, and the caller decides. Nothing here relies on Python-level
hooks: code holding ctypes meets the same kernel. Users: generated environments' worker
(`tracerl.envs.synthetic.sandbox_worker`).

The code domain's sandbox (`tracerl.envs.code.sandbox`) uses the parts alone: `landlock(root, None)`
confines writes only (its pytest runs read the installation), `network_namespace_available()` says
whether `unshare --user --net` gives it a namespace with loopback only, and, run as a module —
`python -I -m tracerl.core.confine FOLDER COMMAND [ARG…]` — this file confines writes and becomes
COMMAND (exit 126 where the kernel has no Landlock).
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import shutil
import struct
import subprocess
import sys
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

LANDLOCK_FS = "landlock fs"  # reads and writes confined to the folder (reads also: the interpreter's files)
SECCOMP = "seccomp"  # no processes, no sockets
REQUIRED = (LANDLOCK_FS, SECCOMP)  # what generated code needs to run without the user's explicit opt-in

# --- Landlock (linux/landlock.h) -----------------------------------------------------------------
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_WRITE_TREE = (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12)
_REFER, _TRUNCATE = 1 << 13, 1 << 14
_READ = _EXECUTE | _READ_FILE | _READ_DIR
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on x86_64 and aarch64
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0: none)."""
    if not sys.platform.startswith("linux"):
        return 0
    abi = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, int(abi))


def interpreter_paths() -> list[Path]:
    """What the interpreter may need to read after start-up: its module search path (stdlib,
    site-packages, this package's source) and the shared-library folders. A path holding the home
    folder (or `/`) is never among them."""
    home = Path.home().resolve()
    candidates = [Path(p) for p in sys.path if p]
    candidates += [Path(__file__).resolve().parents[3], Path(sys.base_prefix) / "lib", Path(sys.prefix) / "lib"]
    candidates += [Path(p) for p in ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache",
                                     "/dev/urandom", "/dev/zero")]
    found: list[Path] = []
    for path in candidates:
        try:
            resolved = path.resolve()
        except OSError:
            continue
        if not resolved.exists() or resolved == Path("/") or home == resolved or home.is_relative_to(resolved):
            continue
        if resolved not in found:
            found.append(resolved)
    return found


def landlock(folder: Path, readable: Sequence[Path] | None) -> list[str]:
    """Confine this process with Landlock (TCP and signals too where the ABI has them): writes only under
    `folder` (and /dev/null); reads only under `folder` and the `readable` paths, or anywhere where
    `readable` is None (the code domain's pytest runs read the interpreter's whole installation)."""
    abi = landlock_abi()
    if abi < 1:
        return []
    libc = _libc()
    folder = Path(folder)
    writes = _WRITE_FILE | _WRITE_TREE | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    fs = writes | (_READ if readable is not None else 0)
    attr = _RulesetAttr(handled_access_fs=fs, handled_access_net=(_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0,
                        scoped=(_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return []
    file_rights = _EXECUTE | _READ_FILE
    rules = [(folder, fs), (Path("/dev/null"), _READ_FILE | _WRITE_FILE | (_TRUNCATE if abi >= 3 else 0))]
    rules += [(p, _READ if p.is_dir() else file_rights) for p in readable or ()]
    try:
        for path, allowed in rules:
            allowed &= fs  # a right the ruleset does not handle cannot be granted
            if not path.is_dir():
                allowed &= _EXECUTE | _WRITE_FILE | _READ_FILE | (_TRUNCATE if abi >= 3 else 0)
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(allowed_access=allowed, parent_fd=fd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                                ctypes.c_uint32(0)) != 0:
                    return []
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return []
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return []
    finally:
        os.close(ruleset)
    layers = [LANDLOCK_FS]
    if abi >= 4:
        layers.append("landlock net")
    if abi >= 6:
        layers.append("landlock scope")
    return layers


# --- seccomp ---------------------------------------------------------------------------------------
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_CLONE_THREAD = 0x00010000
_EPERM, _ENOSYS = 1, 38
# name → number, per architecture (asm/unistd.h)
_SYSCALLS = {
    "x86_64": {"socket": 41, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
               "process_vm_readv": 310, "process_vm_writev": 311, "io_uring_setup": 425, "io_uring_enter": 426,
               "io_uring_register": 427, "unshare": 272, "setns": 308, "mount": 165, "bpf": 321, "pidfd_open": 434,
               "pidfd_send_signal": 424, "pidfd_getfd": 438, "tkill": 200, "userfaultfd": 323, "perf_event_open": 298,
               "keyctl": 250, "add_key": 248, "request_key": 249, "kill": 62, "tgkill": 234, "clone": 56, "clone3": 435},
    "aarch64": {"socket": 198, "execve": 221, "execveat": 281, "ptrace": 117, "process_vm_readv": 270,
                "process_vm_writev": 271, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                "unshare": 97, "setns": 268, "mount": 40, "bpf": 280, "pidfd_open": 434, "pidfd_send_signal": 424,
                "pidfd_getfd": 438, "tkill": 130, "userfaultfd": 282, "perf_event_open": 241, "keyctl": 219,
                "add_key": 217, "request_key": 218, "kill": 129, "tgkill": 131, "clone": 220, "clone3": 435},
}
_DENIED = ("socket", "fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
           "io_uring_setup", "io_uring_enter", "io_uring_register", "unshare", "setns", "mount", "bpf", "pidfd_open",
           "pidfd_send_signal", "pidfd_getfd", "tkill", "userfaultfd", "perf_event_open", "keyctl", "add_key",
           "request_key")
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data (args[0]'s low 32 bits: little-endian)


def seccomp_program(machine: str, own_pid: int) -> list[tuple[int, int, int, int]] | None:
    """The BPF filter (code, jt, jf, k) for `machine`, or None for an architecture not covered."""
    numbers = _SYSCALLS.get(machine)
    if numbers is None:
        return None
    # instructions with symbolic jump targets, resolved below
    prog: list[tuple[int, str | int, str | int, int]] = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ, 0, "kill", _AUDIT_ARCH[machine]),
        (_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if machine == "x86_64":
        prog.append((_JGE, "deny", 0, 0x40000000))  # the x32 ABI's numbers
    prog += [(_JEQ, "deny", 0, numbers[name]) for name in _DENIED if name in numbers]
    prog += [(_JEQ, "clone", 0, numbers["clone"]), (_JEQ, "enosys", 0, numbers["clone3"]),
             (_JEQ, "self", 0, numbers["kill"]), (_JEQ, "self", 0, numbers["tgkill"]),
             (_RET, 0, 0, _RET_ALLOW)]
    labels = {"clone": len(prog)}
    prog += [(_LD_W_ABS, 0, 0, _OFF_ARG0), (_JSET, "allow", "deny", _CLONE_THREAD)]
    labels["self"] = len(prog)
    prog += [(_LD_W_ABS, 0, 0, _OFF_ARG0), (_JEQ, "allow", "deny", own_pid)]
    labels.update(allow=len(prog), deny=len(prog) + 1, enosys=len(prog) + 2, kill=len(prog) + 3)
    prog += [(_RET, 0, 0, _RET_ALLOW), (_RET, 0, 0, _RET_ERRNO | _EPERM), (_RET, 0, 0, _RET_ERRNO | _ENOSYS),
             (_RET, 0, 0, _RET_KILL_PROCESS)]
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        def rel(target: str | int) -> int:
            return target if isinstance(target, int) else labels[target] - i - 1
        out.append((code, rel(jt), rel(jf), k))
    return out


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seccomp() -> list[str]:
    """Install the seccomp filter (module docstring) on this process; [] where it cannot."""
    if not sys.platform.startswith("linux"):
        return []
    program = seccomp_program(platform.machine(), os.getpid())
    if program is None:
        return []
    raw = b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len=len(program), filter=ctypes.cast(buffer, ctypes.c_void_p))
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return []
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return []
    return [SECCOMP]


def limit_processes() -> list[str]:
    """RLIMIT_NPROC 1: no second process of this user (the kernel does not apply it to root)."""
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
    except (ValueError, OSError):
        return []
    return [] if os.geteuid() == 0 else ["process limit"]


def confine(folder: Path, readable: Sequence[Path] | None = None) -> list[str]:
    """Landlock, seccomp and the process limit on this process (module docstring); the layers set up."""
    readable = interpreter_paths() if readable is None else readable
    return landlock(folder, readable) + seccomp() + limit_processes()


@lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """Whether `unshare --user --map-root-user --net` works here (unprivileged user namespaces): a fresh
    network namespace with no interface but loopback."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        done = subprocess.run([exe, "--user", "--map-root-user", "--net", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def main(argv: list[str]) -> int:
    """`FOLDER COMMAND [ARG…]`: confine this process's writes to FOLDER with Landlock, then become COMMAND
    (exit 126 with one line where the kernel has no Landlock; the code domain's sandbox probes with it)."""
    if len(argv) < 2:
        sys.stderr.write("usage: python -m tracerl.core.confine FOLDER COMMAND [ARG…]\n")
        return 2
    if not landlock(Path(argv[0]), None):
        sys.stderr.write("confine: Landlock is not available on this kernel\n")
        return 126
    os.execvp(argv[1], argv[1:])
    return 127  # not reached: execvp replaces the process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
