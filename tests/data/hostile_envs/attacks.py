

# --- attacks (tests/data/hostile_envs/attacks.py) ---------------------------------------------------
import ctypes as _ctypes
import json as _json
import os as _os
import signal as _signal
import socket as _socket
import subprocess as _subprocess
import sys as _sys
import time as _time

SETTINGS = _json.loads(r'''__SETTINGS__''')


def _try(fn):
    try:
        result = fn()
    except BaseException as e:  # noqa: BLE001
        return f"refused: {type(e).__name__} {getattr(e, 'errno', '')}".strip()
    return result


def _secret_from_environment():
    found = {k: v for k, v in _os.environ.items() if "KEY" in k or "TOKEN" in k or "SECRET" in k}
    if found:
        return "DONE: " + _json.dumps(found)
    return "refused: nothing secret in the environment"


def _tcp():
    with _socket.create_connection(("127.0.0.1", SETTINGS["tcp_port"]), timeout=2) as c:
        c.sendall(b"leak-tcp")
    return "DONE"


def _udp():
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    s.sendto(b"leak-udp", ("127.0.0.1", SETTINGS["udp_port"]))
    return "DONE"


def _ctypes_udp():
    libc = _ctypes.CDLL(None, use_errno=True)
    fd = libc.socket(2, 2, 0)  # AF_INET, SOCK_DGRAM
    if fd < 0:
        return f"refused: socket() failed with errno {_ctypes.get_errno()}"
    address = (2).to_bytes(2, "little") + SETTINGS["udp_port"].to_bytes(2, "big") + bytes([127, 0, 0, 1]) + bytes(8)
    sent = libc.sendto(fd, b"leak-ctypes", 11, 0, address, 16)
    return "DONE" if sent > 0 else f"refused: sendto() failed with errno {_ctypes.get_errno()}"


def _write_outside():
    with open(SETTINGS["outside_file"], "w") as f:
        f.write("escaped")
    return "DONE"


def _read(path):
    def read():
        with open(path) as f:
            return "DONE: " + f.read()
    return read


def _os_system():
    code = _os.system(f"touch {SETTINGS['marker_file']}")
    return "DONE" if _os.path.exists(SETTINGS["marker_file"]) else f"refused: os.system returned {code}"


def _spawn():
    proc = _subprocess.Popen([_sys.executable, "-c", "import time; time.sleep(120)", SETTINGS["token"]],
                             start_new_session=True)
    return f"DONE: pid {proc.pid}"


def _fork():
    pid = _os.fork()
    if pid == 0:
        _os.setsid()
        _time.sleep(120)
        _os._exit(0)
    return f"DONE: pid {pid}"


def _ctypes_fork():
    libc = _ctypes.CDLL(None, use_errno=True)
    pid = libc.fork()
    if pid == 0:
        libc.setsid()
        _time.sleep(120)
        _os._exit(0)
    return f"DONE: pid {pid}" if pid > 0 else f"refused: fork() failed with errno {_ctypes.get_errno()}"


def _signal_parent():
    _os.kill(_os.getppid(), 0)  # signal 0: only asks whether it could be signalled
    return "DONE"


def attack():
    """Every way out, each 'refused: …' or 'DONE…'."""
    return {
        "secret in the environment": _secret_from_environment(),
        "tcp to 127.0.0.1": _try(_tcp),
        "udp to 127.0.0.1": _try(_udp),
        "udp through ctypes": _try(_ctypes_udp),
        "write outside its folder": _try(_write_outside),
        "read a key under a home folder": _try(_read(SETTINGS["secret_file"])),
        "read /etc/shadow": _try(_read("/etc/shadow")),
        "read the parent's environ": _try(_read(f"/proc/{_os.getppid()}/environ")),
        "os.system": _try(_os_system),
        "spawn a process that outlives it": _try(_spawn),
        "fork": _try(_fork),
        "fork through ctypes": _try(_ctypes_fork),
        "signal the parent": _try(_signal_parent),
    }
