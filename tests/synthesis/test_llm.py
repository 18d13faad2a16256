"""LLM-written environments through a real local HTTP endpoint serving canned chat completions."""

import pytest
import synthesis_cases as cases
from contract_cases import capabilities_file

from tracerl.cli import main
from tracerl.contracts import EnvIndex
from tracerl.core.io import read_json
from tracerl.envs.synthetic.checks import play
from tracerl.envs.synthetic.envdir import load_env_dir, load_env_spec
from tracerl.models.analysis import AnalysisClient, AnalysisConfig
from tracerl.synthesis.llm import extract_code, generate_env_module
from tracerl.synthesis.sandbox import SandboxLimits
from synthesis_cases import CannedServer, needs_confinement

LIMITS = SandboxLimits(cpu_seconds=6,  # the memory bomb (child start included) must hit memory first
                       wall_seconds=120, memory_bytes=1 << 30, seeds=20)


CAP = {"name": "look_before_acting", "description": "Read the record before changing it."}


def client_of(server, max_retries=2):
    return AnalysisClient(AnalysisConfig(base_url=server.url, model="canned", max_retries=max_retries, backoff=0.01))


def test_extract_code():
    assert extract_code(cases.fenced("x = 1\n")) == "x = 1\n"
    assert extract_code("no code here") is None


def test_errors_are_fed_back_until_a_module_passes(retail):
    answers = ["I think you should read the record first.", cases.fenced(cases.broken_oracle()), cases.fenced(cases.GOOD)]
    with CannedServer(answers) as server:
        client = client_of(server)
        result = generate_env_module(CAP, retail, client, examples=["agent cancelled without reading"], limits=LIMITS)
    assert result.ok and result.source == cases.GOOD
    assert [r.ok for r in result.rounds] == [False, True]  # the answer without code is asked again, not a round
    assert len(server.requests) == 3
    first = server.requests[0]["messages"]
    assert "look_before_acting" in first[1]["content"] and "cancel_pending_order" in first[1]["content"]
    assert "agent cancelled without reading" in first[1]["content"]
    assert server.requests[1]["messages"] == first
    third = server.requests[2]["messages"]
    assert "oracle: oracle scores < 1 on 20 of 20 seeds" in third[-1]["content"]
    assert third[-2]["role"] == "assistant"  # the failed module stays in the conversation
    assert client.stats.summary() == "3 requests: 3 answered, 1 of them unusable (33.3%); 0 without an answer"


def test_the_domain_policy_reaches_the_writer(retail):
    from dataclasses import replace

    policy = "# Retail agent policy\nCancel pending order: not if it was placed more than 30 days ago."
    with CannedServer([cases.fenced(cases.GOOD)]) as server:
        generate_env_module(CAP, replace(retail, policy=policy), client_of(server), limits=LIMITS)
    prompt = server.requests[0]["messages"][1]["content"]
    assert "The domain's policy (its rules are the ones your environment states):\n" + policy in prompt
    assert "invent no rule that contradicts it" in server.requests[0]["messages"][0]["content"]


def test_an_endpoint_that_never_answers_stops_the_writer_with_one_line(retail):
    import socket

    from tracerl.core.errors import InputError

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    client = AnalysisClient(AnalysisConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1, backoff=0))
    with pytest.raises(InputError, match=r"^analysis model m at .*: no answer to the environment writer's requests "
                                         r"\(2 requests: 0 answered; 2 without an answer\); last: cannot reach"):
        generate_env_module(CAP, retail, client, limits=LIMITS)


@pytest.mark.slow
@needs_confinement
def test_hostile_answers_are_contained_and_reported_then_it_stops(retail, tmp_path):
    escape = tmp_path / "escaped.txt"
    hostile = [cases.INFINITE_LOOP, cases.MEMORY_BOMB, cases.writer(escape), cases.connector(9), cases.SYNTAX_ERROR,
               cases.GOOD]  # the good one comes too late: 5 rounds at most
    with CannedServer([cases.fenced(h) for h in hostile]) as server:
        result = generate_env_module(CAP, retail, client_of(server, max_retries=0), limits=LIMITS, max_rounds=5)
    assert not result.ok and result.source is None and len(server.requests) == 5
    problems = [r.problem for r in result.rounds]
    assert problems[0] == "killed: ran past the CPU-time limit of 6 s"
    assert problems[1] == "ran out of memory (limit 1024 MiB)"
    assert f"PermissionError: [Errno 13] Permission denied: '{escape}'" in problems[2]
    assert "PermissionError: [Errno 1] Operation not permitted" in problems[3]
    assert problems[4].startswith("import failed: SyntaxError")
    assert result.last_problem == problems[4]
    assert not escape.exists()


def test_synthesize_command_with_an_llm(retail, tmp_path, capsys):
    caps = capabilities_file(tmp_path / "capabilities.json", ["look_before_acting"], ["tone_and_empathy"],
                             examples={"look_before_acting": [("7", "cancelled without reading")]})
    out = tmp_path / "envs"
    with CannedServer([cases.fenced(cases.drifted_schema()), cases.fenced(cases.GOOD)]) as server:
        code = main(["synthesize", "--capabilities", str(caps), "--target", retail.source, "--out", str(out),
                     "--analysis-base-url", server.url, "--analysis-model", "canned", "--no-calibrate"])
    assert code == 0, capsys.readouterr()
    assert "cancelled without reading" in server.requests[0]["messages"][1]["content"]
    env_dir = out / "look_before_acting"
    assert (env_dir / "env.py").read_text() == cases.GOOD
    spec = load_env_spec(env_dir)
    assert (spec.source, spec.module, spec.target) == ("llm", "env.py", "retail")
    assert read_json(env_dir / "checks.json")["checks"][2]["passed"]
    make_env = load_env_dir(env_dir)
    env = make_env()
    assert play(env, 5, env.oracle(5))[0] == 1.0
    (record,) = EnvIndex.read(out / "index.json").environments
    assert (record.capability, record.status, record.source) == ("look_before_acting", "DONE", "llm")
    assert record.environment == "look_before_acting" and spec.description == "look_before_acting description"
    assert "schema: tool 'cancel_pending_order' requires []" in server.requests[1]["messages"][-1]["content"]
