"""Known-good, broken and hostile env modules in the sandbox: each is contained and reported."""

import socket
import threading

import pytest
import synthesis_cases as cases
from synthesis_cases import needs_confinement

from tracerl.core.confine import REQUIRED
from tracerl.synthesis.llm import check_module_source
from tracerl.synthesis.sandbox import SandboxLimits, network_namespace_available

FAST = SandboxLimits(cpu_seconds=10, wall_seconds=60, memory_bytes=1 << 30, seeds=20)


@needs_confinement
def test_known_good_module_passes(retail):
    result = check_module_source(cases.GOOD, retail, FAST)
    assert result.ok, result.summary()
    assert [c.name for c in result.report.checks] == ["schema", "determinism", "oracle", "do_nothing", "hints"]
    assert result.report.get("oracle").detail == "oracle scores 1.0 on 20 seeds"
    assert {"rlimits", "call wall-clock", "throw-away folder", "clean environment", *REQUIRED} <= set(result.isolation)


@pytest.mark.parametrize("source, check, message", [
    (cases.broken_oracle(), "oracle", "oracle scores < 1 on 20 of 20 seeds"),
    (cases.drifted_schema(), "schema", "requires [], the target requires"),
    (cases.nondeterministic(), "determinism", "two resets give different tasks"),
])
def test_broken_modules_fail_the_right_check(retail, source, check, message):
    result = check_module_source(source, retail, FAST)
    assert not result.ok
    assert not result.report.get(check).passed and message in result.report.get(check).detail
    assert message in result.summary()


def test_syntax_error_is_reported(retail):
    result = check_module_source(cases.SYNTAX_ERROR, retail, FAST)
    assert not result.ok and result.error.startswith("import failed: SyntaxError")


@pytest.mark.slow
def test_infinite_loop_is_stopped_by_the_cpu_limit(retail):
    result = check_module_source(cases.INFINITE_LOOP, retail, SandboxLimits(cpu_seconds=2, wall_seconds=120))
    assert not result.ok and result.error == "killed: ran past the CPU-time limit of 2 s"


@pytest.mark.slow
def test_sleeper_is_stopped_by_the_wall_clock(retail):
    result = check_module_source(cases.SLEEPER, retail, SandboxLimits(cpu_seconds=10, wall_seconds=3))
    assert not result.ok and result.error == "killed: ran past the wall-clock limit of 3 s"


@pytest.mark.slow
def test_memory_bomb_is_stopped_by_the_memory_limit(retail):
    result = check_module_source(cases.MEMORY_BOMB, retail, SandboxLimits(memory_bytes=1 << 30, wall_seconds=120))
    assert not result.ok and result.error == "ran out of memory (limit 1024 MiB)"


@needs_confinement
def test_write_outside_its_folder_is_refused(retail, tmp_path):
    target = tmp_path / "escaped.txt"
    result = check_module_source(cases.writer(target), retail, FAST)
    assert not result.ok and result.error.startswith(f"import failed: PermissionError: [Errno 13] Permission denied: '{target}'")
    assert "the sandbox allows no processes, no sockets and no files outside the module's own folder" in result.error
    assert not target.exists()


@needs_confinement
def test_subprocess_is_refused(retail):
    result = check_module_source(cases.SUBPROCESS, retail, FAST)
    assert not result.ok and result.error.startswith("import failed: PermissionError: [Errno 1] Operation not permitted")


def test_api_keys_are_not_passed_on(retail, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    assert check_module_source(cases.SECRET_READER, retail, FAST).ok


@pytest.fixture
def listener():
    """A real local TCP server that counts the connections it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn.recv(16))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


@needs_confinement
def test_network_is_refused(retail, listener):
    port, accepted = listener
    result = check_module_source(cases.connector(port), retail, FAST)
    assert not result.ok and result.error.startswith("import failed: PermissionError: [Errno 1] Operation not permitted")
    result = check_module_source(cases.raw_socket(), retail, FAST)
    assert not result.ok and result.error.startswith("import failed: PermissionError: [Errno 1] Operation not permitted")
    assert accepted == []  # nothing reached the server
    # the listener itself works: a connection from this (unsandboxed) process gets through
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(b"ok")
    for _ in range(50):
        if accepted:
            break
        threading.Event().wait(0.05)
    assert accepted == [b"ok"]


def test_network_namespace_probe_is_a_bool():
    assert network_namespace_available() in (True, False)


def test_landlock_alone_confines_writes(tmp_path):
    """Landlock alone (no seccomp, no namespace) refuses writes outside the folder."""
    import subprocess
    import sys

    inside, outside = tmp_path / "inside", tmp_path / "outside.txt"
    inside.mkdir()
    code = (
        "import sys, os\n"
        "from pathlib import Path\n"
        "from tracerl.core.confine import interpreter_paths, landlock\n"
        f"layers = landlock(Path({str(inside)!r}), interpreter_paths())\n"
        "if not layers: print('unavailable'); sys.exit(0)\n"
        f"open({str(inside / 'ok.txt')!r}, 'w').write('fine')\n"
        "try:\n"
        f"    os.open({str(outside)!r}, os.O_WRONLY | os.O_CREAT)\n"
        "    print('escaped')\n"
        "except PermissionError:\n"
        "    print('refused')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if out.stdout.strip() == "unavailable":
        pytest.skip("this kernel has no Landlock")
    assert out.stdout.strip() == "refused", out.stderr
    assert (inside / "ok.txt").read_text() == "fine" and not outside.exists()
