"""The LLM labeller and discovery over real HTTP, against a small OpenAI-compatible server
started in the test: good replies, garbage, partial replies, HTTP errors, timeouts, a dead endpoint."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tracerl.cli import main
from tracerl.core.errors import InputError
from tracerl.core.io import write_jsonl
from tracerl.envs.loading import load_rollouts
from tracerl.selection.catalogue import builtin_capabilities
from tracerl.selection.discovery import discover
from tracerl.models.analysis import AnalysisClient, AnalysisConfig
from tracerl.selection.llm import LLMLabeller, compact_trajectory

Reply = Callable[[dict[str, Any], int], tuple[int, str]]  # (request body, attempt number of this prompt) -> (status, content)


class ChatServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, reply: Reply, delay: float = 0.0):
        super().__init__(("127.0.0.1", 0), ChatHandler)
        self.reply = reply
        self.delay = delay
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.attempts: dict[str, int] = {}
        self.inflight = 0
        self.max_inflight = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class ChatHandler(BaseHTTPRequestHandler):
    server: ChatServer

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        s = self.server
        key = json.dumps(body["messages"])
        with s.lock:
            s.requests.append(body)
            s.attempts[key] = attempt = s.attempts.get(key, 0) + 1
            s.inflight += 1
            s.max_inflight = max(s.max_inflight, s.inflight)
        try:
            if s.delay:
                time.sleep(s.delay)
            status, content = s.reply(body, attempt)
        finally:
            with s.lock:
                s.inflight -= 1
        payload = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
        data = json.dumps(payload if status == 200 else {"error": {"message": content}}).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass

    def log_message(self, *args: Any) -> None:
        pass


def serve(reply: Reply, delay: float = 0.0) -> Iterator[ChatServer]:
    server = ChatServer(reply, delay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def capability_names(body: dict[str, Any]) -> list[str]:
    return re.findall(r"^- (\w+):", body["messages"][0]["content"], re.MULTILINE)


def judge(body: dict[str, Any], attempt: int) -> tuple[int, str]:
    """A 'model' that labels multi_step_completion LACKING on failed trajectories, PRESENT on passed, rest NA."""
    failed = " — FAILED" in body["messages"][1]["content"]
    labels = {
        n: {"label": ("LACKING" if failed else "PRESENT") if n == "multi_step_completion" else "NA", "evidence": "turn 1"}
        for n in capability_names(body)
    }
    return 200, "Here you go:\n```json\n" + json.dumps({"labels": labels}) + "\n```"


def config(url: str, **kw: Any) -> AnalysisConfig:
    return AnalysisConfig(base_url=url, model="judge", timeout=kw.pop("timeout", 5.0),
                          max_retries=kw.pop("max_retries", 2), backoff=0.01, **kw)


@pytest.fixture
def trajectories(tau2_data: Path) -> list:
    ts = load_rollouts(tau2_data / "retail" / "sample_results.json")
    return [t for t in ts if not t.passed][:4] + [t for t in ts if t.passed][:4]


CAPS = builtin_capabilities()[:3] + builtin_capabilities()[-1:]  # 3 real + 1 decoy: short prompts


def test_labels_over_http_with_bounded_concurrency_and_distinct_seeds(trajectories: list) -> None:
    for server in serve(judge, delay=0.05):
        labeller = LLMLabeller(config(server.url, concurrency=3))
        rows = labeller.label(trajectories, CAPS, run_seed=7)
        assert labeller.problems == []
        for t, row in zip(trajectories, rows):
            assert row["multi_step_completion"].label == ("PRESENT" if t.passed else "LACKING")
            assert row["language_fluency"].label == "NA" and row["multi_step_completion"].evidence == "turn 1"
        assert len(server.requests) == len(trajectories)
        assert 1 <= server.max_inflight <= 3
        assert sorted(b["seed"] for b in server.requests) == [7 * 1_000_003 + i for i in range(len(trajectories))]
        assert all(b["temperature"] == 0.7 and b["model"] == "judge" for b in server.requests)


def test_garbage_replies_leave_pairs_unlabelled_counted_and_reported(trajectories: list) -> None:
    def some_garbage(body: dict[str, Any], attempt: int) -> tuple[int, str]:
        return (200, "I think the agent did fine!") if "— PASSED" in body["messages"][1]["content"] else judge(body, attempt)

    for server in serve(some_garbage):
        labeller = LLMLabeller(config(server.url, max_retries=2))
        rows = labeller.label(trajectories[3:6], CAPS, run_seed=0)  # one failed, two passed
        passed = [t.passed for t in trajectories[3:6]]
        assert passed == [False, True, True]
        assert all(p.label is None and "unusable answer" in p.evidence for row in rows[1:] for p in row.values())
        assert rows[0]["multi_step_completion"].label == "LACKING"
        assert len(labeller.problems) == 2 and "no JSON object" in labeller.problems[0]
        assert len(server.requests) == 1 + 2 * 3  # the good one once; 1 try + 2 retries each of the others
        stats = labeller.client.stats
        assert (stats.requests, stats.answered, stats.unusable, stats.failed) == (7, 7, 6, 0)
        assert stats.summary() == "7 requests: 7 answered, 6 of them unusable (85.7%); 0 without an answer"


def test_only_garbage_stops_the_labeller_with_one_line(trajectories: list) -> None:
    for server in serve(lambda body, attempt: (200, "I think the agent did fine!")):
        labeller = LLMLabeller(config(server.url, max_retries=1))
        with pytest.raises(InputError, match=r"^analysis model judge at http://127\.0\.0\.1:\d+/v1: none of 3 labelling "
                           r"requests got a usable answer \(6 requests: 6 answered, 6 of them unusable \(100\.0%\); 0 "
                           r"without an answer\); last: unusable answer \(no JSON object in the reply\)") as e:
            labeller.label(trajectories[:3], CAPS, run_seed=0)
        assert "\n" not in str(e.value)


def test_retry_recovers_from_a_bad_first_reply(trajectories: list) -> None:
    def flaky(body: dict[str, Any], attempt: int) -> tuple[int, str]:
        return (200, '{"labels": {"oops": ') if attempt == 1 else judge(body, attempt)

    for server in serve(flaky):
        labeller = LLMLabeller(config(server.url))
        rows = labeller.label(trajectories[:2], CAPS, run_seed=0)
        assert labeller.problems == [] and all(p.label is not None for row in rows for p in row.values())
        assert len(server.requests) == 4


def test_partial_and_invalid_labels(trajectories: list) -> None:
    def partial(body: dict[str, Any], attempt: int) -> tuple[int, str]:
        labels = {n: "PRESENT" for n in capability_names(body)}
        labels["structured_data_reasoning"] = "MAYBE"
        return 200, json.dumps(labels)

    for server in serve(partial):
        labeller = LLMLabeller(config(server.url, max_retries=1))
        row = labeller.label(trajectories[:1], CAPS, run_seed=0)[0]
        assert row["structured_data_reasoning"].label is None and "structured_data_reasoning" in row["structured_data_reasoning"].evidence
        assert row["multi_step_completion"].label == "PRESENT"
        assert len(labeller.problems) == 1


def test_http_errors_timeouts_and_dead_endpoint(trajectories: list) -> None:
    def overloaded_once(body: dict[str, Any], attempt: int) -> tuple[int, str]:
        return (500, "overloaded, try later") if "— PASSED" in body["messages"][1]["content"] else judge(body, attempt)

    for server in serve(overloaded_once):
        labeller = LLMLabeller(config(server.url, max_retries=1))
        rows = labeller.label(trajectories[3:5], CAPS, run_seed=0)
        assert all(p.label is None for p in rows[1].values()) and rows[0]["multi_step_completion"].label == "LACKING"
        assert labeller.problems[0].endswith(f"HTTP 500 from {server.url}: overloaded, try later")  # the server's reason
        assert len(server.requests) == 3 and labeller.client.stats.failed == 2
    for server in serve(lambda body, attempt: (400, "model 'judge' does not exist")):
        with pytest.raises(InputError, match="none of 2 labelling requests.*last: HTTP 400 from .*: model 'judge' does "
                                             "not exist$"):
            LLMLabeller(config(server.url, max_retries=1)).label(trajectories[:2], CAPS, run_seed=0)
    for server in serve(judge, delay=1.0):
        with pytest.raises(InputError, match=r"last: no answer from .* within 0\.2 s$"):
            LLMLabeller(config(server.url, timeout=0.2, max_retries=1)).label(trajectories[:2], CAPS, run_seed=0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(InputError, match=f"last: cannot reach http://127.0.0.1:{port}/v1 \\(ConnectError\\)$"):
        LLMLabeller(config(f"http://127.0.0.1:{port}/v1", max_retries=1)).label(trajectories[:2], CAPS, run_seed=0)


def test_compaction_cuts_text_and_keeps_failure_reasons(trajectories: list) -> None:
    t = trajectories[0].model_copy(deep=True)
    t.messages[1].content = "word " * 200
    text = compact_trajectory(t)
    assert "FAILED" in text and "grader:" in text and "expected action not matched" in text
    assert all(len(line) < 360 for line in text.splitlines()[2:])
    assert "…" in text


def test_discovery_validates_and_merges(trajectories: list) -> None:
    proposals = {"capabilities": [
        {"name": "order_state_checking", "description": "Checks order status.", "example_task_ids": [1, "2"]},
        {"name": "multi_step_completion", "description": "dup of the catalogue", "example_task_ids": []},
        {"name": "refund_math", "description": "Computes refunds."},
        {"name": "item_matching", "description": "Matches item options."},
    ]}
    for server in serve(lambda body, attempt: (200, json.dumps(proposals))):
        found = discover(AnalysisClient(config(server.url)), trajectories, seed=0)
        assert [c.name for c in found] == ["order_state_checking", "multi_step_completion", "refund_math", "item_matching"]
        assert found[0].source == "discovered" and found[0].example_task_ids == ["1", "2"]
        assert "FAILED" in server.requests[0]["messages"][1]["content"]
    too_few = {"capabilities": proposals["capabilities"][:2]}
    for server in serve(lambda body, attempt: (200, json.dumps(too_few))):
        with pytest.raises(InputError, match="discovery failed after 2 attempts"):
            discover(AnalysisClient(config(server.url, max_retries=1)), trajectories, seed=0)


def test_select_with_llm_labeller_end_to_end(trajectories: list, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    write_jsonl(path, trajectories)
    proposals = {"capabilities": [{"name": f"skill_number_{w}", "description": "d"} for w in ("one", "two", "three", "four")]}

    def reply(body: dict[str, Any], attempt: int) -> tuple[int, str]:
        return (200, json.dumps(proposals)) if "Propose between 4 and 10" in body["messages"][0]["content"] else judge(body, attempt)

    for server in serve(reply):
        out = tmp_path / "sel"
        rc = main(["select", "--rollouts", str(path), "--labeler", "llm", "--runs", "3", "--discover", "--out", str(out),
                   "--analysis-base-url", server.url, "--analysis-model", "judge", "--analysis-timeout", "5",
                   "--json"])
        assert rc == 0
        doc = json.loads(capsys.readouterr().out)
        assert {c["name"] for c in doc["capabilities"] if c["selected"]} == {"multi_step_completion"}
        assert {c["name"] for c in doc["capabilities"]} >= {"skill_number_one", "tool_call_precision"}
        assert doc["labeler"] == {"name": "llm", "deterministic": False, "note": "3 independent runs with distinct seeds"}
        seeds = {json.loads((out / "labels" / f"run_{r:02d}.json").read_text())["seed"] for r in range(3)}
        assert seeds == {0, 1, 2}
        assert len(server.requests) == 1 + 3 * len(trajectories)


def test_select_with_a_garbage_endpoint_exits_2_and_writes_nothing(trajectories: list, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    write_jsonl(path, trajectories)
    for server in serve(lambda body, attempt: (200, "no idea")):
        rc = main(["select", "--rollouts", str(path), "--labeler", "llm", "--runs", "2", "--out", str(tmp_path / "sel"),
                   "--analysis-base-url", server.url, "--analysis-model", "judge", "--analysis-max-retries", "0",
                   "--json"])
        assert rc == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "\n" not in captured.err.strip()
        assert f"none of {len(trajectories)} labelling requests got a usable answer" in captured.err
        assert not (tmp_path / "sel" / "capabilities.json").exists() and not (tmp_path / "sel" / "labels").exists()


def test_select_reports_the_share_of_unusable_answers(trajectories: list, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    write_jsonl(path, trajectories)

    def half(body: dict[str, Any], attempt: int) -> tuple[int, str]:
        return (200, "no idea") if "— PASSED" in body["messages"][1]["content"] else judge(body, attempt)

    for server in serve(half):
        rc = main(["select", "--rollouts", str(path), "--labeler", "llm", "--runs", "2", "--out", str(tmp_path / "sel"),
                   "--analysis-base-url", server.url, "--analysis-model", "judge", "--analysis-max-retries", "0",
                   "--json"])
        assert rc == 0
        captured = capsys.readouterr()
        doc = json.loads(captured.out)
        assert doc["unlabelled_pairs"] == 2 * 4 * len(builtin_capabilities())
        assert "analysis model: 16 requests: 16 answered, 8 of them unusable (50.0%); 0 without an answer" in captured.err
        assert "8 labelling requests failed (pairs left unlabelled)" in captured.err
