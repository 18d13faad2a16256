"""Builders of hand-made trajectories for the selection tests."""

from __future__ import annotations

from typing import Any

import pytest

from tracerl.core.messages import Message, ToolCall
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory


def _schema(name: str, kind: str, *params: str) -> ToolSchema:
    return ToolSchema(name=name, kind=kind, parameters={"type": "object", "properties": {p: {"type": "string"} for p in params}})  # type: ignore[arg-type]


AIRLINE_TOOLS = [
    _schema("get_user_details", "read", "user_id"),
    _schema("get_reservation_details", "read", "reservation_id"),
    _schema("search_direct_flight", "read", "origin", "destination", "date"),
    _schema("cancel_reservation", "write", "reservation_id"),
    _schema("update_reservation_flights", "write", "reservation_id", "cabin", "flights", "payment_id"),
    _schema("update_reservation_baggages", "write", "reservation_id", "total_baggages", "nonfree_baggages", "payment_id"),
    _schema("send_certificate", "write", "user_id", "amount"),
    _schema("calculate", "generic", "expression"),
]


def make_trajectory(
    steps: list[tuple[Any, ...]],
    *,
    gold: list[tuple[str, dict[str, Any]]] | None = None,
    passed: bool = False,
    task_id: str = "t",
    termination: str = "user_stop",
    **info: Any,
) -> Trajectory:
    """steps: ("call", name, args, result) | ("say", text) | ("user", text). A result starting
    with "Error:" is an error. `gold`: (name, arguments) pairs; extra keyword arguments go to info."""
    messages = [Message.system("policy"), Message.user("hello")]
    n = 0
    for step in steps:
        if step[0] == "call":
            _, name, args, result = step
            n += 1
            call = ToolCall.make(name, args, f"c{n}")
            messages.append(Message.assistant(None, [call]))
            messages.append(Message.tool(result, tool_call_id=call.id, name=name))
        elif step[0] == "say":
            messages.append(Message.assistant(step[1]))
        else:
            messages.append(Message.user(step[1]))
    if gold is not None:
        info["gold_actions"] = [{"name": g, "arguments": a} for g, a in gold]
    return Trajectory(task_id=task_id, domain="airline", messages=messages, tools=AIRLINE_TOOLS, reward=float(passed),
                      passed=passed, termination=termination, info=info)


@pytest.fixture
def traj():
    return make_trajectory
