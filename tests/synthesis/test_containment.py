"""Generated environment code attacking its sandbox (tests/data/hostile_envs), run for real: the kernel
refuses every way out, the verdict is the parent's, nothing it read reaches the analysis model, no
process it starts outlives it, and every stage plays it only through the sandbox."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import synthesis_cases as cases
from tracerl.models.analysis import AnalysisClient, AnalysisConfig
from synthesis_cases import CannedServer, needs_confinement

from tracerl.cli import main
from tracerl.composition.stage import roll_gate_data
from tracerl.core.io import read_jsonl
from tracerl.core.trajectory import Trajectory
from tracerl.contracts import EnvSpec
from tracerl.envs.synthetic.checks import play
from tracerl.core.confine import REQUIRED
from tracerl.envs.synthetic.envdir import load_env_dir, write_env_dir
from tracerl.envs.synthetic.sandbox import (
    ALLOW_UNCONFINED,
    ConfinementUnavailable,
    GeneratedCodeError,
    SandboxedEnv,
    SandboxFailure,
    SandboxWorker,
    WorkerLimits,
    check_confinement,
)
from tracerl.synthesis.llm import check_module_source, generate_env_module
from tracerl.synthesis.sandbox import SandboxLimits
from tracerl.synthesis.scripted import NoisyOraclePolicy
from tracerl.synthesis.synthesize import calibrate_env_dir
from tracerl.training.run import resolve_env

FAST = SandboxLimits(cpu_seconds=10, wall_seconds=60, memory_bytes=1 << 30, seeds=4)
API_KEY = "sk-test-3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"
ATTACKS = 13  # the attacks of attacks.py


class Listeners:
    """A TCP and a UDP server on 127.0.0.1 that keep whatever reaches them."""

    def __init__(self):
        self.tcp, self.udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen()
        self.udp.bind(("127.0.0.1", 0))
        for s in (self.tcp, self.udp):
            s.settimeout(0.1)
        self.received: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.tcp.accept()
                self.received.append(conn.recv(64))
                conn.close()
            except OSError:
                pass
            try:
                self.received.append(self.udp.recv(64))
            except OSError:
                pass

    def close(self):
        self.stop.set()
        self.thread.join()
        self.tcp.close()
        self.udp.close()


@pytest.fixture
def listeners():
    server = Listeners()
    yield server
    server.close()


@pytest.fixture
def attack(tmp_path, listeners, monkeypatch):
    """The attack settings: real listeners, a secret under a home folder outside the module's, a token."""
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    secret = tmp_path / "home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LWtleS1tYXRlcmlhbC0xMjM0NTY3ODkw\n"
                      "-----END OPENSSH PRIVATE KEY-----\nplain words of the secret: tangerine-walrus\n")
    token = f"tracerl-outliver-{os.getpid()}-{time.monotonic_ns()}"
    settings = {"tcp_port": listeners.tcp.getsockname()[1], "udp_port": listeners.udp.getsockname()[1],
                "outside_file": str(tmp_path / "escaped.txt"), "marker_file": str(tmp_path / "marker"),
                "secret_file": str(secret), "token": token}
    yield settings
    assert listeners.received == []  # nothing got out to the network
    assert not Path(settings["outside_file"]).exists() and not Path(settings["marker_file"]).exists()
    assert processes_with(token) == []  # nothing outlived the sandbox


def processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def all_refused(outcomes: dict) -> None:
    assert len(outcomes) == ATTACKS
    done = {k: v for k, v in outcomes.items() if not v.startswith("refused")}
    assert done == {}


@needs_confinement
def test_attacks_at_import_are_refused_by_the_kernel(retail, attack):
    result = check_module_source(cases.attacking(attack, at="import"), retail, FAST)
    assert not result.ok and result.error.startswith("import failed: RuntimeError: attack outcomes ")
    outcomes = json.loads(result.error.split("attack outcomes ", 1)[1].rsplit(" (at env.py", 1)[0])
    all_refused(outcomes)
    assert set(REQUIRED) <= set(result.isolation)


def llm_env_dir(path: Path, source: str, target) -> Path:
    spec = EnvSpec(capability="look_before_acting", description="d", source="llm", module="env.py", target=target.name)
    return write_env_dir(path, spec, target, module_source=source)


@needs_confinement
def test_every_stage_plays_a_generated_env_only_in_the_sandbox(retail, attack, tmp_path):
    """Checks (training's validation), calibration, rollouts and gate data: the module attacks on every
    reset, from the worker, and every attack is refused; the rewards are still the environment's."""
    env_dir = llm_env_dir(tmp_path / "envs" / "look_before_acting", cases.attacking(attack, at="play"), retail)
    make_env, name, _ = resolve_env(env_dir)  # what `tracerl train` and the train stage call (validates it)
    env = make_env()
    assert isinstance(env, SandboxedEnv) and name == "look_before_acting"
    messages, info = env.reset(seed=3)
    all_refused(info["attacks"])
    assert play(env, 3, env.oracle(3))[0] == 1.0
    result = calibrate_env_dir(env_dir, NoisyOraclePolicy(1.0), seeds=2, group_size=2, max_rounds=1)
    assert result.stats.success_rate == 1.0
    data, (path,) = roll_gate_data({"look_before_acting": env_dir}, lambda: None, 2, tmp_path / "gate",
                                   openings_only=True)  # the compose stage's gate data: the environment's openings
    assert data.kept["look_before_acting"].openings == 2 and len(read_jsonl(path, Trajectory)) == 2
    assert API_KEY not in json.dumps(info) and "tangerine-walrus" not in json.dumps(info)


def test_a_forged_report_and_exit_0_is_not_a_pass(retail):
    result = check_module_source(cases.hostile("forged_report"), retail, FAST)
    assert not result.ok and result.report is None
    assert result.error == "exited with code 0"


def test_replacing_the_grader_inside_the_worker_changes_nothing(retail):
    result = check_module_source(cases.hostile("replace_grader", base=cases.broken_oracle()), retail, FAST)
    assert not result.ok
    assert not result.report.get("oracle").passed and "oracle scores < 1 on 4 of 4 seeds" in result.summary()


@needs_confinement
def test_a_secret_read_outside_never_reaches_the_next_prompt(retail, attack):
    answers = [cases.fenced(cases.hostile("leak_secret", attack, base=cases.GOOD)), cases.fenced(cases.GOOD)]
    with CannedServer(answers) as server:
        client = AnalysisClient(AnalysisConfig(base_url=server.url, model="canned"))
        result = generate_env_module({"name": "x", "description": "y"}, retail, client, limits=FAST)
    assert result.ok and [r.ok for r in result.rounds] == [False, True]
    feedback = server.requests[1]["messages"][-1]["content"]
    assert "here is what I found" in feedback and "Permission denied" in feedback
    for secret in ("tangerine-walrus", "c2VjcmV0LWtleS1tYXRlcmlhbC0xMjM0NTY3ODkw", API_KEY):
        assert secret not in feedback
    assert len(feedback) < 5000


def test_replies_out_of_the_protocol_fail_the_checks(retail):
    bad_reward = cases.GOOD.replace("return 0.5 * self.read + 0.5 * wrote,", "return 5.0 * self.read + 0.5 * wrote,")
    result = check_module_source(bad_reward, retail, FAST)
    assert not result.ok and "returned the reward 5.5, not a number in [0, 1]" in result.report.get("oracle").detail
    foreign = cases.GOOD.replace('return "Thanks.", True', 'return "Thanks.", True\n\n    def step(self, m):\n'
                                 '        out = super().step(m)\n'
                                 '        return [Message.tool("x", tool_call_id="forged", name="y")], *out[1:]')
    result = check_module_source(foreign, retail, FAST)
    assert not result.ok and "tool result for a call the agent did not make" in result.summary()


def test_an_oversized_reply_ends_the_worker(retail, tmp_path):
    source = cases.GOOD.replace('return "Look the record up', 'return "x" * (3 << 20) + "Look the record up')
    env_dir = llm_env_dir(tmp_path / "env", source, retail)
    factory = load_env_dir(env_dir, limits=WorkerLimits(reply_bytes=1 << 20))
    env = factory()
    with pytest.raises(SandboxFailure, match=r"answered \d+ bytes to hint\(\) \(limit 1048576\)"):
        env.hint(0)
    with pytest.raises(SandboxFailure):  # the worker is gone for good
        factory()


def test_a_call_past_its_time_kills_the_worker(retail, tmp_path):
    source = cases.GOOD.replace("def hint(self, seed):", "def hint(self, seed):\n        import time; time.sleep(60)")
    factory = load_env_dir(llm_env_dir(tmp_path / "env", source, retail), limits=WorkerLimits(call_seconds=2))
    env = factory()
    pid = factory.worker._proc.pid
    with pytest.raises(SandboxFailure, match=r"killed: hint\(\) ran past the wall-clock limit of 2 s for one call"):
        env.hint(0)
    assert not alive(pid)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_an_exception_in_generated_code_is_one_bounded_line(retail, tmp_path):
    source = cases.GOOD.replace("def hint(self, seed):", "def hint(self, seed):\n        raise ValueError('no\\n' * 5000)")
    factory = load_env_dir(llm_env_dir(tmp_path / "env", source, retail))
    with pytest.raises(GeneratedCodeError) as e:
        factory().hint(0)
    assert "\n" not in str(e.value) and len(str(e.value)) < 1600 and "ValueError: no no" in str(e.value)
    assert "(at env.py:" in str(e.value)


def test_the_worker_ends_with_its_factory_and_with_its_parent(retail, tmp_path):
    env_dir = llm_env_dir(tmp_path / "env", cases.GOOD, retail)
    factory = load_env_dir(env_dir)
    pid = factory.worker._proc.pid
    assert alive(pid)
    factory.close()
    assert not alive(pid)
    # a parent killed with SIGKILL: its worker reads the end of its pipe and exits
    script = textwrap.dedent(f"""
        import sys, time
        from tracerl.envs.synthetic.envdir import load_env_dir
        factory = load_env_dir({str(env_dir)!r})
        print(factory.worker._proc.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    assert alive(worker)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        if not alive(worker):
            break
        time.sleep(0.1)
    assert not alive(worker)


@needs_confinement
def test_seccomp_alone_refuses_sockets_and_processes(tmp_path, listeners):
    """Without a network namespace (no unshare here): the kernel still refuses UDP and new processes."""
    folder = tmp_path / "env"
    folder.mkdir()
    code = textwrap.dedent(f"""
        import os, socket, sys
        from pathlib import Path
        from tracerl.core.confine import confine
        layers = confine(Path({str(folder)!r}))
        if "seccomp" not in layers: print("unavailable"); sys.exit(0)
        out = []
        try:
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"leak", ("127.0.0.1", {listeners.udp.getsockname()[1]}))
            out.append("udp sent")
        except PermissionError:
            out.append("udp refused")
        try:
            os.fork()
            out.append("forked")
        except PermissionError:
            out.append("fork refused")
        print(" ".join(out))
    """)
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    if done.stdout.strip() == "unavailable":
        pytest.skip("no seccomp filter for this machine")
    assert done.stdout.strip() == "udp refused fork refused", done.stderr
    time.sleep(0.3)
    assert listeners.received == []


def test_without_confinement_generated_code_needs_the_loud_opt_in(monkeypatch, capsys):
    monkeypatch.delenv(ALLOW_UNCONFINED, raising=False)
    with pytest.raises(ConfinementUnavailable, match="--allow-unconfined-generated-code") as e:
        check_confinement(["landlock fs"], "envs/x/env.py")
    assert str(e.value).startswith("envs/x/env.py: this kernel cannot confine generated code (missing: seccomp)")
    check_confinement(list(REQUIRED), "envs/x/env.py")  # all there: nothing to say
    monkeypatch.setenv(ALLOW_UNCONFINED, "1")
    check_confinement([], "envs/x/env.py")
    assert "WARNING: running generated code envs/x/env.py WITHOUT confinement" in capsys.readouterr().err


def test_the_cli_flag_sets_the_opt_in(monkeypatch):
    monkeypatch.setenv(ALLOW_UNCONFINED, "0")  # restored after the test
    assert main(["--allow-unconfined-generated-code", "show", "--help"]) == 0
    assert os.environ.get(ALLOW_UNCONFINED) == "1"


@needs_confinement
def test_the_worker_reports_its_layers_before_any_generated_code_runs(retail, tmp_path):
    env_dir = llm_env_dir(tmp_path / "env", cases.GOOD, retail)
    worker = SandboxWorker(env_dir, "env.py", source="x")
    try:
        assert set(REQUIRED) <= set(worker.isolation) and "clean environment" in worker.isolation
    finally:
        worker.close()
