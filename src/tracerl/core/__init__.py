"""Core data model: messages, tool schemas, trajectories, the policy interface, file I/O."""

from tracerl.core.errors import InputError
from tracerl.core.messages import Action, FunctionCall, Message, ToolCall, canonical_json
from tracerl.core.policy import Policy, Session
from tracerl.core.tools import ToolSchema, load_tools_json
from tracerl.core.trajectory import TokenRecord, Trajectory, TrajectoryGroup

__all__ = [
    "Action", "FunctionCall", "InputError", "Message", "Policy", "Session", "TokenRecord",
    "ToolCall", "ToolSchema", "Trajectory", "TrajectoryGroup", "canonical_json", "load_tools_json",
]
