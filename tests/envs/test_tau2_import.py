"""τ²-bench results import, load_rollouts content detection, and `tracerl show`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracerl.cli import main
from tracerl.core.errors import InputError
from tracerl.core.io import write_jsonl
from tracerl.core.tools import load_tools_json
from tracerl.envs.loading import load_rollouts


@pytest.fixture
def sample(tau2_data: Path) -> Path:
    return tau2_data / "retail" / "sample_results.json"


@pytest.fixture
def doc(sample: Path) -> dict:
    return json.loads(sample.read_text())


def test_sample_results_become_trajectories(sample: Path, doc: dict) -> None:
    trajs = load_rollouts(sample)
    assert len(trajs) == 114
    assert sum(t.passed for t in trajs) == 92
    t = trajs[0]
    sim = doc["simulations"][0]
    assert t.task_id == sim["task_id"] and t.domain == "retail" and t.termination == "user_stop"
    # tool calls: OpenAI format with JSON-string arguments equal to τ²'s dicts
    raw_calls = [c for m in sim["messages"] if m["role"] == "assistant" for c in (m["tool_calls"] or [])]
    calls = t.tool_calls()
    assert [c.name for c in calls] == [c["name"] for c in raw_calls]
    assert [json.loads(c.function.arguments) for c in calls] == [c["arguments"] for c in raw_calls]
    # every tool message answers a call by id and carries the tool's name
    ids = {c.id: c.name for c in calls}
    tools_msgs = [m for m in t.messages if m.role == "tool"]
    assert tools_msgs and all(m.tool_call_id in ids and m.name == ids[m.tool_call_id] for m in tools_msgs)
    # reward info and gold actions intact
    assert t.info["action_checks"] == sim["reward_info"]["action_checks"]
    assert t.info["db_check"] == {"db_match": True, "db_reward": 1.0}
    gold = doc["tasks"][0]["evaluation_criteria"]["actions"]
    assert t.info["gold_actions"] == [{"name": a["name"], "arguments": a["arguments"]} for a in gold]
    assert t.info["communicate_info"] == []
    # without tool schemas, kinds come from the action checks' tool_type
    assert t.info["tools_source"] == "action_checks"
    assert t.tool_kinds()["exchange_delivered_order_items"] == "write"
    assert t.tool_kinds()["get_order_details"] == "read"


def test_error_tool_messages_start_with_error(sample: Path) -> None:
    trajs = load_rollouts(sample)
    errors = [m for t in trajs for m in t.messages if m.role == "tool" and m.is_error]
    assert len(errors) == 28


def test_tools_json_gives_full_schemas(sample: Path, tau2_data: Path) -> None:
    tools_path = tau2_data / "retail" / "tools.json"
    trajs = load_rollouts(sample, tools=tools_path)
    t = trajs[0]
    assert t.info["tools_source"] == "tools.json"
    assert len(t.tools) == len(load_tools_json(tools_path)) == 16
    schema = {s.name: s for s in t.tools}["cancel_pending_order"]
    assert schema.kind == "write" and "order_id" in schema.parameters["properties"]


def test_tool_defs_in_file_win(doc: dict, tmp_path: Path, tau2_data: Path) -> None:
    doc["info"]["environment_info"]["tool_defs"] = json.loads((tau2_data / "retail" / "tools.json").read_text())
    doc["info"]["environment_info"]["policy"] = "You are a retail agent."
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    t = load_rollouts(path)[0]
    assert t.info["tools_source"] == "tool_defs" and len(t.tools) == 16
    assert t.messages[0].role == "system" and t.messages[0].content == "You are a retail agent."


def test_user_tool_calls_are_dropped_and_counted(doc: dict, tmp_path: Path) -> None:
    sim = doc["simulations"][0]
    sim["messages"][1:1] = [
        {"role": "user", "content": "let me check", "tool_calls": [{"id": "u1", "name": "toggle_airplane_mode", "arguments": {}, "requestor": "user"}]},
        {"role": "tool", "id": "u1", "content": "done", "requestor": "user", "error": False},
    ]
    doc["simulations"] = [sim]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc, indent=1))
    t = load_rollouts(path)[0]
    assert t.info["user_tool_calls"] == 1
    assert "toggle_airplane_mode" not in [c.name for c in t.tool_calls()]
    assert all(m.tool_call_id != "u1" for m in t.messages)


def test_jsonl_round_trip(sample: Path, tmp_path: Path) -> None:
    trajs = load_rollouts(sample)
    path = tmp_path / "r.jsonl"
    write_jsonl(path, trajs)
    assert load_rollouts(path) == trajs


def test_show_reports_the_sample(sample: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(sample), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["count"] == 114 and summary["passed"] == 92
    assert summary["terminations"] == {"user_stop": 114}
    assert summary["action_checks"] == {"total": 550, "matched": 528}
    assert summary["tool_calls"]["total"] == 538 and summary["tool_calls"]["by_tool"]["get_order_details"] == 168
    assert summary["task_kinds"]["read_only"]["count"] == 10
    assert main(["show", str(sample)]) == 0
    out = capsys.readouterr().out
    assert "114" in out and "92 (80.7%)" in out


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"task_id": "1", "domain": "d", "messages": []}\n{not json\n', "r.jsonl:2: not valid JSON"),
        ('{"task_id": "1", "domain": "d", "messages": []}\n{"domain": "d", "messages": []}\n', "r.jsonl:2: missing field 'task_id'"),
        ('{"task_id": "1", "domain": "d", "messages": [], "reward": "high"}\n', "r.jsonl:1: field 'reward'"),
        ('[1, 2]\n', "neither tracerl JSONL"),
        ("\n\n", "empty file"),
        ('{\n  "tasks": [],\n  "simulations": [\n    {"id": 1,,}\n  ]\n}\n', "r.jsonl:4: not valid JSON"),
    ],
)
def test_show_reports_malformed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, expected: str) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(content)
    assert main(["show", str(path)]) == 2
    assert expected in _error_line(capsys)


def test_malformed_tau2_simulation_names_file_and_line(doc: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    del doc["simulations"][3]["messages"]
    path = tmp_path / "bad.json"
    text = json.dumps(doc, indent=2)
    path.write_text(text)
    line = text[: text.index(json.dumps(doc["simulations"][3]["id"]))].count("\n") + 1
    assert main(["show", str(path)]) == 2
    assert f"bad.json:{line}: simulations[3]: missing field 'messages'" in _error_line(capsys)
    doc["simulations"][3]["messages"] = [{"role": "robot", "content": "x"}]
    path.write_text(json.dumps(doc, indent=2))
    with pytest.raises(InputError, match=r"simulations\[3\]: messages\[0\].role 'robot'"):
        load_rollouts(path)
    doc["simulations"][3]["messages"] = []
    doc["simulations"][3]["task_id"] = "no-such-task"
    path.write_text(json.dumps(doc, indent=2))
    with pytest.raises(InputError, match="task_id 'no-such-task' is not among"):
        load_rollouts(path)


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl: no such file" in _error_line(capsys)
