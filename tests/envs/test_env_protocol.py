"""The Env protocol's shared mechanics (ToolEnv, Toolbox, runner) on a toy environment."""

from typing import Literal

import pytest

from tracerl.core.messages import Message, ToolCall
from tracerl.envs.base import ToolEnv
from tracerl.envs.runner import Episode, rollout
from tracerl.envs.tools import Toolbox, ToolError, tool


class CounterTools(Toolbox):
    def __init__(self, start: int):
        self.value = start
        super().__init__()

    @tool("read")
    def get_value(self) -> dict:
        """Read the counter."""
        return {"value": self.value}

    @tool("write")
    def add(self, amount: int, mode: Literal["up", "down"] = "up") -> dict:
        """Change the counter.

        Args:
            amount: How much to add, such as 3.
            mode: 'up' adds, 'down' subtracts.
        """
        if amount < 0:
            raise ToolError("amount must be non-negative")
        self.value += amount if mode == "up" else -amount
        return {"value": self.value}


class CounterEnv(ToolEnv):
    """Task: bring the counter from seed % 5 to 10. The user ends the chat on 'bye'."""

    name = "counter"
    max_turns = 6

    def _setup(self, seed, options):
        self.box = CounterTools(seed % 5)
        return self.box, [Message.system("Reach 10."), Message.user(f"Start is {seed % 5}.")], {"task_id": f"c{seed}"}

    def _user_reply(self, text):
        return ("ok bye", True) if "bye" in text else ("go on", False)

    def _score(self):
        return float(self.box.value == 10), {"DB": float(self.box.value == 10)}


def call(name, args, cid="c0"):
    return Message.assistant(tool_calls=[ToolCall.make(name, args, cid)])


def test_schema_derived_from_signature_and_docstring():
    schemas = {s.name: s for s in CounterEnv().tools}
    add = schemas["add"]
    assert add.kind == "write" and schemas["get_value"].kind == "read"
    assert add.description == "Change the counter."
    props = add.parameters["properties"]
    assert props["amount"] == {"type": "integer", "description": "How much to add, such as 3."}
    assert props["mode"]["enum"] == ["up", "down"]
    assert add.parameters["required"] == ["amount"]


@pytest.mark.parametrize(
    "message, error",
    [
        (call("nope", {}), "Error: unknown tool 'nope'"),
        (Message.assistant(tool_calls=[ToolCall(id="x", function={"name": "add", "arguments": "{oops"})]), "not valid JSON"),
        (call("add", {"amount": "many"}), "Error: invalid arguments for 'add': amount"),
        (call("add", {"amount": 1, "color": "red"}), "color: Extra inputs"),
        (call("add", {"amount": -1}), "Error: amount must be non-negative"),
    ],
)
def test_bad_tool_calls_become_error_messages(message, error):
    env = CounterEnv()
    env.reset(seed=2)
    out, reward, terminated, truncated, _ = env.step(message)
    assert out[0].role == "tool" and error in out[0].content and out[0].content.startswith("Error:")
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_episode_scores_once_at_the_end():
    env = CounterEnv()
    messages, info = env.reset(seed=7)
    assert info == {"task_id": "c7"} and messages[1].content == "Start is 2."
    out, reward, done, trunc, _ = env.step(call("add", {"amount": 8}))
    assert out[0].content == '{"value": 10}' and reward == 0.0 and not done
    out, reward, done, trunc, info = env.step(Message.assistant("done, bye"))
    assert (reward, done, trunc) == (1.0, True, False)
    assert info["termination"] == "user_stop" and info["reward_breakdown"] == {"DB": 1.0}
    with pytest.raises(RuntimeError):
        env.step(Message.assistant("again"))


def test_max_turns_truncates_with_zero_reward():
    env = CounterEnv()
    env.reset(seed=0)
    for turn in range(6):
        _, reward, done, trunc, info = env.step(call("get_value", {}))
    assert trunc and not done and reward == 0.0 and info["termination"] == "max_turns"


def test_too_many_errors_terminates_with_zero_reward():
    env = CounterEnv(max_turns=50)
    env.max_errors = 3
    env.reset(seed=0)
    for _ in range(3):
        _, reward, done, trunc, info = env.step(call("nope", {}))
    assert done and reward == 0.0 and info["termination"] == "too_many_errors"


class GreedyCounterPolicy:
    """Adds what is missing, then says bye."""

    name = "greedy"

    def act(self, sessions):
        out = []
        for s in sessions:
            last = s.messages[-1]
            if last.role == "tool":
                out.append(Message.assistant("bye"))
            else:
                start = int(s.messages[1].content.split()[-1].rstrip("."))
                out.append(call("add", {"amount": 10 - start}))
        return out


def test_rollout_batches_and_keeps_order():
    episodes = [Episode(seed=s) for s in range(7)]
    trajs = rollout(CounterEnv, GreedyCounterPolicy(), episodes, batch_size=3)
    assert [t.task_id for t in trajs] == [f"c{s}" for s in range(7)]
    assert all(t.passed and t.termination == "user_stop" and t.num_turns == 2 for t in trajs)
    assert [m.role for m in trajs[0].messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert trajs[0].tools[0].name in {"add", "get_value"}
