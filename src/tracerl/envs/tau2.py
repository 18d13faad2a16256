"""τ²-bench interop: read a results file (what `tau2 run` writes) into `Trajectory` records.

A results file has `info` (run settings; `environment_info.domain_name`, `.policy`, `.tool_defs`),
`tasks` (with gold actions under `evaluation_criteria`) and `simulations` (one per run, with
`messages`, `reward_info`, `termination_reason`). Each simulation becomes one trajectory:

- messages in OpenAI format: tool calls get JSON-string arguments, tool messages get
  `tool_call_id` and the tool's name, a tool message flagged `error` starts with "Error:";
  the policy text (when the file has it) becomes the system message. Tool calls made by the
  *user* simulator (τ²'s telecom domain) are not the agent's: they are dropped and counted in
  `info["user_tool_calls"]`.
- `info`: `gold_actions` ({name, arguments} of the task's assistant actions),
  `action_checks`, `db_check`, `communicate_checks`, `nl_assertions` (as τ²-bench graded them),
  `communicate_info`, `task_kind` (the task's write tools joined by "+", or "read_only"),
  `simulation_id`, `trial`, `source` = "tau2", `tools_source`.
- tools: the file's `tool_defs` when present, else the `tools` given (e.g. from a domain's
  tools.json), else one schema per tool name whose kind τ²-bench recorded in an action check's
  `tool_type` (parameters unknown). Kinds missing from the chosen schemas are filled in from the
  action checks too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error, read_json, read_text
from tracerl.core.messages import Message, ToolCall, canonical_json
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory
from tracerl.envs.runner import passed as reward_passes


def is_tau2_results(doc: Any) -> bool:
    """Whether a parsed JSON document looks like a τ²-bench results file."""
    return isinstance(doc, dict) and "simulations" in doc and "tasks" in doc


def tau2_trajectories(doc: dict[str, Any], *, path: str, text: str = "", tools: list[ToolSchema] | None = None) -> list[Trajectory]:
    """Convert a parsed τ²-bench results document. Problems raise one-line `InputError`s naming
    the file and, where it can be found, the line of the offending simulation."""
    info = _mapping(doc.get("info") or {}, "info", path)
    env_info = _mapping(info.get("environment_info") or {}, "info.environment_info", path)
    domain = str(env_info.get("domain_name") or "tau2")
    policy = env_info.get("policy") or ""
    tasks = _tasks_by_id(doc.get("tasks"), path)
    sims = doc.get("simulations")
    if not isinstance(sims, list):
        raise InputError("'simulations' must be a list", path=path)
    kinds = _kinds_from_action_checks(sims)
    schemas, source = _choose_tools(env_info.get("tool_defs"), tools, kinds, path)
    out = []
    for i, sim in enumerate(sims):
        where = f"simulations[{i}]"
        line = _line_of(text, sim.get("id") if isinstance(sim, dict) else None)
        try:
            out.append(_trajectory(sim, tasks, domain, policy, schemas, source))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            raise InputError(f"{where}: {_reason(e)}", path=path, line=line) from None
    return out


# --- tools -------------------------------------------------------------------------------

def _kinds_from_action_checks(sims: list[Any]) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for sim in sims:
        if not isinstance(sim, dict) or not isinstance(sim.get("reward_info"), dict):
            continue
        checks = sim["reward_info"].get("action_checks") or []
        for check in checks if isinstance(checks, list) else []:
            if not isinstance(check, dict) or not isinstance(check.get("action"), dict):
                continue
            name = check["action"].get("name")
            kind = check.get("tool_type")
            if isinstance(name, str) and kind in ("read", "write", "generic"):
                kinds.setdefault(name, kind)
    return kinds


def _choose_tools(
    tool_defs: Any, given: list[ToolSchema] | None, kinds: dict[str, str], path: str
) -> tuple[list[ToolSchema], str]:
    if tool_defs:
        entries = list(tool_defs.values()) if isinstance(tool_defs, dict) else tool_defs
        try:
            schemas, source = [ToolSchema.from_openai(e) for e in entries], "tool_defs"
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InputError(f"info.environment_info.tool_defs is malformed ({_reason(e)})", path=path) from None
    elif given:
        schemas, source = [t.model_copy() for t in given], "tools.json"
    else:
        return [ToolSchema(name=n, kind=k) for n, k in sorted(kinds.items())], "action_checks"
    for t in schemas:  # fill kinds the schemas left generic from what τ²-bench recorded
        if t.kind == "generic" and kinds.get(t.name, "generic") != "generic":
            t.kind = kinds[t.name]  # type: ignore[assignment]
    return schemas, source


# --- tasks and simulations -------------------------------------------------------------------

def _tasks_by_id(tasks: Any, path: str) -> dict[str, dict[str, Any]]:
    if not isinstance(tasks, list):
        raise InputError("'tasks' must be a list", path=path)
    out = {}
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or "id" not in task:
            raise InputError(f"tasks[{i}]: missing field 'id'", path=path)
        out[str(task["id"])] = task
    return out


def _trajectory(
    sim: Any, tasks: dict[str, dict[str, Any]], domain: str, policy: str, tools: list[ToolSchema], tools_source: str
) -> Trajectory:
    if not isinstance(sim, dict):
        raise TypeError("a simulation must be a JSON object")
    task_id = str(_field(sim, "task_id"))
    task = tasks.get(task_id)
    if task is None:
        raise ValueError(f"task_id '{task_id}' is not among the file's tasks")
    criteria = _object(task.get("evaluation_criteria") or {}, f"task {task_id}'s evaluation_criteria")
    gold = [
        {"name": a["name"], "arguments": a.get("arguments") or {}}
        for a in criteria.get("actions") or []
        if a.get("requestor", "assistant") == "assistant"
    ]
    reward_info = _object(sim.get("reward_info") or {}, "reward_info")
    reward = float(reward_info.get("reward") or 0.0)
    messages, user_calls = _messages(_field(sim, "messages"), policy)
    kinds = {t.name: t.kind for t in tools}
    writes = [a["name"] for a in gold if kinds.get(a["name"]) == "write"]
    info: dict[str, Any] = {
        "source": "tau2",
        "simulation_id": sim.get("id"),
        "trial": sim.get("trial"),
        "task_kind": "+".join(dict.fromkeys(writes)) or "read_only",
        "gold_actions": gold,
        "communicate_info": list(criteria.get("communicate_info") or []),
        "action_checks": _action_checks(reward_info.get("action_checks") or []),
        "db_check": reward_info.get("db_check"),
        "communicate_checks": reward_info.get("communicate_checks"),
        "nl_assertions": reward_info.get("nl_assertions"),
        "tools_source": tools_source,
    }
    if user_calls:
        info["user_tool_calls"] = user_calls
    breakdown = {str(k): float(v) for k, v in (reward_info.get("reward_breakdown") or {}).items() if v is not None}
    seed = sim.get("seed")
    return Trajectory(
        task_id=task_id,
        domain=domain,
        seed=int(seed) if seed is not None else None,
        messages=messages,
        tools=tools,
        reward=reward,
        passed=reward_passes(reward),
        reward_breakdown=breakdown,
        termination=str(sim.get("termination_reason") or "error"),
        info=info,
    )


def _messages(raw: Any, policy: str) -> tuple[list[Message], int]:
    if not isinstance(raw, list):
        raise TypeError("'messages' must be a list")
    out = [Message.system(policy)] if policy else []
    names: dict[str, str] = {}
    user_call_ids: set[str] = set()
    for j, m in enumerate(raw):
        if not isinstance(m, dict):
            raise TypeError(f"messages[{j}] must be a JSON object")
        role = m.get("role")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise TypeError(f"messages[{j}].content must be text")
        if role in ("assistant", "user"):
            calls = []
            for k, c in enumerate(m.get("tool_calls") or []):
                try:
                    call_id, name, args = str(c["id"]), str(c["name"]), c.get("arguments") or {}
                except (KeyError, TypeError):
                    raise ValueError(f"messages[{j}].tool_calls[{k}] needs 'id' and 'name'") from None
                names[call_id] = name
                if role == "user" or c.get("requestor") == "user":
                    user_call_ids.add(call_id)
                    continue
                arguments = args if isinstance(args, str) else canonical_json(args)
                calls.append(ToolCall.model_validate({"id": call_id, "function": {"name": name, "arguments": arguments}}))
            if role == "user":
                if content:
                    out.append(Message.user(content))
            else:
                out.append(Message.assistant(content, calls))
        elif role == "tool":
            call_id = str(_field(m, "id", f"messages[{j}]."))
            if call_id in user_call_ids or m.get("requestor") == "user":
                continue
            text = content or ""
            if m.get("error") and not text.startswith("Error:"):
                text = f"Error: {text}"
            out.append(Message.tool(text, tool_call_id=call_id, name=names.get(call_id, "")))
        elif role == "system":
            out.append(Message.system(content or ""))
        else:
            raise ValueError(f"messages[{j}].role '{role}' is not assistant, user, tool or system")
    return out, len(user_call_ids)


# --- small helpers -------------------------------------------------------------------------

def _field(obj: dict[str, Any], key: str, prefix: str = "") -> Any:
    if key not in obj:
        raise KeyError(f"{prefix}{key}")
    return obj[key]


def _action_checks(checks: Any) -> list[dict[str, Any]]:
    """τ²-bench's action checks as they are, once each is seen to be an object whose action is one."""
    if not isinstance(checks, list):
        raise TypeError(f"'reward_info.action_checks' must be a list, not {type(checks).__name__}")
    for k, check in enumerate(checks):
        _object(check, f"reward_info.action_checks[{k}]")
        if "action" in check:
            _object(check["action"], f"reward_info.action_checks[{k}].action")
    return checks


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"'{what}' must be a JSON object, not {type(value).__name__}")
    return value


def _mapping(value: Any, what: str, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"'{what}' must be a JSON object", path=path)
    return value


def _reason(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"missing field '{e.args[0]}'"
    if isinstance(e, ValidationError):
        return describe_validation_error(e)
    return (str(e).splitlines() or [type(e).__name__])[0]


def _line_of(text: str, sim_id: Any) -> int | None:
    """The line of a simulation's `"id": "<sim_id>"` in the file text (None when not found)."""
    if not text or not isinstance(sim_id, str):
        return None
    needle = json.dumps(sim_id)
    pos = text.find(needle)
    return None if pos < 0 else text.count("\n", 0, pos) + 1


def read_tau2_results(path: str | Path, tools: list[ToolSchema] | None = None) -> list[Trajectory]:
    """Read a τ²-bench results JSON file into trajectories."""
    path = Path(path)
    doc = read_json(path)
    if not is_tau2_results(doc):
        raise InputError("not a τ²-bench results file (needs 'tasks' and 'simulations')", path=str(path))
    return tau2_trajectories(doc, path=str(path), text=read_text(path), tools=tools)
