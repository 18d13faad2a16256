import json

import pytest

from tracerl.core.errors import InputError
from tracerl.core.messages import Action, Message, ToolCall
from tracerl.core.tools import load_tools_json
from tracerl.core.trajectory import Trajectory
from tracerl.core.io import read_jsonl, write_jsonl
from tracerl.core.trajectory import TokenRecord


def _traj(task_id="t1") -> Trajectory:
    call = ToolCall.make("get_user_details", {"user_id": "u1"}, "call_0")
    return Trajectory(
        task_id=task_id,
        domain="airline",
        seed=3,
        messages=[
            Message.system("policy"),
            Message.user("hi"),
            Message.assistant(tool_calls=[call]),
            Message.tool('{"user_id": "u1"}', tool_call_id="call_0", name="get_user_details"),
            Message.assistant("done"),
        ],
        reward=1.0,
        passed=True,
        info={"gold_actions": [{"name": "get_user_details", "arguments": {"user_id": "u1"}}]},
    )


def test_tool_call_arguments_roundtrip_and_malformed():
    call = ToolCall.make("f", {"b": 1, "a": [1, 2]}, "c1")
    assert call.function.arguments == '{"a":[1,2],"b":1}'
    assert call.parsed_arguments() == {"a": [1, 2], "b": 1}
    bad = ToolCall(id="c2", function={"name": "f", "arguments": '{"a": '})
    assert bad.parsed_arguments() is None
    assert ToolCall(id="c3", function={"name": "f", "arguments": "[1]"}).parsed_arguments() is None


def test_message_openai_dict_drops_none():
    assert Message.user("hi").to_openai() == {"role": "user", "content": "hi"}
    tool_msg = Message.tool("Error: nope", tool_call_id="c", name="f")
    assert tool_msg.is_error and not Message.tool("{}", tool_call_id="c", name="f").is_error


def test_trajectory_helpers():
    t = _traj()
    assert [c.name for c in t.tool_calls()] == ["get_user_details"]
    assert t.gold_actions() == [Action(name="get_user_details", arguments={"user_id": "u1"})]
    assert t.num_turns == 2


def test_token_record_lengths_must_agree():
    TokenRecord(ids=[1, 2], logprobs=[0.0, -0.5], mask=[0, 1])
    with pytest.raises(ValueError):
        TokenRecord(ids=[1, 2], logprobs=[0.0], mask=[0, 1])


def test_jsonl_roundtrip_is_byte_identical(tmp_path):
    path = tmp_path / "r.jsonl"
    write_jsonl(path, [_traj("a"), _traj("b")])
    first = path.read_bytes()
    back = read_jsonl(path, Trajectory)
    assert [t.task_id for t in back] == ["a", "b"]
    write_jsonl(path, back)
    assert path.read_bytes() == first
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize(
    "line, expected",
    [
        ("{not json", "r.jsonl:2: not valid JSON"),
        (json.dumps({"domain": "x", "messages": []}), "r.jsonl:2: missing field 'task_id'"),
        (json.dumps({"task_id": "x", "domain": "x", "messages": [], "reward": "high"}), "r.jsonl:2: field 'reward'"),
        (json.dumps({"task_id": "x", "domain": "x", "messages": [{"role": "robot"}]}), "r.jsonl:2: field 'messages.0.role'"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, line, expected):
    path = tmp_path / "r.jsonl"
    path.write_text(_traj().model_dump_json() + "\n" + line + "\n")
    with pytest.raises(InputError) as err:
        read_jsonl(path, Trajectory)
    assert str(err.value).startswith(str(tmp_path / expected))
    assert "\n" not in str(err.value)


def test_load_tools_json_kinds_and_signature(tau2_data):
    tools = {t.name: t for t in load_tools_json(tau2_data / "airline" / "tools.json")}
    assert tools["cancel_reservation"].kind == "write"
    assert tools["get_user_details"].kind == "read"
    assert tools["calculate"].kind == "generic"
    sig = tools["book_reservation"].parameter_signature()
    assert "flights" in sig["properties"] and "user_id" in sig["required"]
    assert tools["get_user_details"].to_openai()["function"]["name"] == "get_user_details"


def test_load_tools_json_errors(tmp_path):
    bad = tmp_path / "tools.json"
    bad.write_text('[{"type": "function",\n "function": }]')
    with pytest.raises(InputError, match=r"tools.json:2: not valid JSON"):
        load_tools_json(bad)
    bad.write_text('{"a": 1}')
    with pytest.raises(InputError, match="expected a JSON list"):
        load_tools_json(bad)
