"""Core data model: messages, tool schemas, trajectories, the policy interface, file I/O."""

_EXPORTS = {
    "InputError": "tracerl.core.errors", "Action": "tracerl.core.messages", "FunctionCall": "tracerl.core.messages",
    "Message": "tracerl.core.messages", "ToolCall": "tracerl.core.messages",
    "canonical_json": "tracerl.core.messages", "Policy": "tracerl.core.policy", "Session": "tracerl.core.policy",
    "ToolSchema": "tracerl.core.tools", "load_tools_json": "tracerl.core.tools",
    "TokenRecord": "tracerl.core.trajectory", "Trajectory": "tracerl.core.trajectory",
    "TrajectoryGroup": "tracerl.core.trajectory",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):  # lazy: importing `tracerl.core.errors` need not load the pydantic models
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
