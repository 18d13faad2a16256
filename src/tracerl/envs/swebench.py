"""SWE-bench's files in and out: agent trajectories with their evaluation reports as rollouts, and
a run's patches as SWE-bench predictions.

In — `load_swebench(folder)` reads every agent trajectory under a folder and grades it by the
SWE-bench evaluation report found there, so `tracerl select --rollouts FOLDER` (and a run config's
`target.results: FOLDER`) selects capabilities from a real code agent's runs:

- trajectories: mini-swe-agent's `<instance_id>.traj.json` (`messages` in chat format; each
  assistant turn's ```bash``` block becomes a `bash` tool call and the `<returncode>…<output>`
  answer its tool message) and SWE-agent's `<instance_id>.traj` (its `trajectory` steps: the
  thought as text, the action as a call of the SWE-agent command it starts with — `open`, `edit`,
  `search_dir`, `submit`, … — or `bash`, with the whole action as `command`; the observation as
  the tool message);
- reports: SWE-bench's per-instance `report.json` (`{instance_id: {resolved, tests_status}}`, or
  the inner object alone, as a file `<instance_id>.report.json` or a `report.json` in a folder
  named after the instance) or a run's summary (`resolved_ids`, `unresolved_ids`, …). A trajectory
  with no report is an error (nothing says whether it passed).

Each rollout passes iff the report says resolved; its info keeps `instance_id`, `FAIL_TO_PASS` and
`PASS_TO_PASS` (where the report lists them), `model_patch` (the agent's submission) and
`exit_status`.

Out — `write_predictions(trajectories, path, model)` writes SWE-bench's predictions JSONL
(`instance_id`, `model_name_or_path`, `model_patch`), the input of
`python -m swebench.harness.run_evaluation --predictions_path PATH` (the live route: the `swebench`
package with Docker, see docs/code-agents.md). `read_predictions` reads one back, checked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tracerl.core.errors import InputError
from tracerl.core.io import atomic_write_text
from tracerl.core.messages import Message, ToolCall
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory

DOMAIN = "swe-bench"
PREDICTION_KEYS = ("instance_id", "model_name_or_path", "model_patch")
# SWE-agent's commands (its default and editing bundles) and their kinds; any other action is `bash`.
SWE_AGENT_COMMANDS = {
    "open": "read", "goto": "read", "scroll_up": "read", "scroll_down": "read", "search_dir": "read",
    "search_file": "read", "find_file": "read", "create": "write", "edit": "write", "str_replace_editor": "write",
    "submit": "write", "bash": "write",
}
_BASH_BLOCK = re.compile(r"```(?:bash|sh)?\s*\n(.*?)\n```", re.DOTALL)
_OUTPUT = re.compile(r"^\s*<returncode>(-?\d+)</returncode>", re.DOTALL)


def trajectory_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and (p.name.endswith(".traj.json") or p.suffix == ".traj"))


def is_swebench_folder(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and bool(trajectory_files(path))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON ({e.msg})", path=str(path), line=e.lineno) from None
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", path=str(path)) from None


def _instance_report(data: Any) -> bool:
    return isinstance(data, dict) and "resolved" in data


def reports(folder: Path) -> dict[str, dict[str, Any]]:
    """instance id → {resolved, tests_status?} from every report under `folder`."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.rglob("*.json")):
        if path.name.endswith(".traj.json"):
            continue
        data = _read_json(path)
        if not isinstance(data, dict):
            continue
        if "resolved_ids" in data:  # a run's summary
            for key, resolved in (("resolved_ids", True), ("unresolved_ids", False), ("error_ids", False)):
                ids = data.get(key) or []
                if isinstance(ids, str):  # sb-cli writes some id lists as a Python repr
                    ids = re.findall(r"'([^']+)'", ids)
                for i in ids:
                    found.setdefault(str(i), {"resolved": resolved})
        elif _instance_report(data):  # the inner object alone: named by its file or folder
            name = path.name[: -len(".report.json")] if path.name.endswith(".report.json") else path.parent.name
            found[name] = data
        else:
            for key, value in data.items():
                if _instance_report(value):
                    found[str(key)] = value
    return found


def load_swebench(folder: str | Path) -> list[Trajectory]:
    """The rollouts of every trajectory under `folder`, graded by its reports (see the module docstring)."""
    folder = Path(folder)
    files = trajectory_files(folder)
    if not files:
        raise InputError("no agent trajectory (*.traj.json, *.traj) in the folder", path=str(folder))
    graded = reports(folder)
    out = []
    for path in files:
        data = _read_json(path)
        if not isinstance(data, dict):
            raise InputError("a trajectory file must hold a JSON object", path=str(path))
        instance = str(data.get("instance_id") or path.name.removesuffix(".traj.json").removesuffix(".traj"))
        report = graded.get(instance)
        if report is None:
            raise InputError(f"no evaluation report for instance {instance} (a report.json or a run summary with "
                             "resolved_ids in the folder)", path=str(path))
        if "messages" in data:
            messages, tools = _mini_messages(data["messages"], path)
        elif "trajectory" in data:
            messages, tools = _swe_agent_messages(data, path)
        else:
            raise InputError("neither a mini-swe-agent trajectory ('messages') nor a SWE-agent one ('trajectory')",
                             path=str(path))
        info_in = data.get("info") or {}
        status = report.get("tests_status") or {}
        info: dict[str, Any] = {"instance_id": instance, "model_patch": info_in.get("submission") or "",
                                "exit_status": info_in.get("exit_status"),
                                "source": "mini-swe-agent" if "messages" in data else "swe-agent"}
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            if key in status:
                info[key] = list(status[key].get("success", [])) + list(status[key].get("failure", []))
        resolved = bool(report["resolved"])
        exit_status = str(info_in.get("exit_status") or "").lower()
        out.append(Trajectory(task_id=instance, domain=DOMAIN, messages=messages, tools=tools,
                              reward=1.0 if resolved else 0.0, passed=resolved,
                              termination="agent_stop" if exit_status.startswith("submitted") else "max_steps",
                              info=info))
    return out


def _schema(name: str) -> ToolSchema:
    return ToolSchema(name=name, description=f"SWE-agent's `{name}` command" if name != "bash" else "a shell command",
                      parameters={"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
                      kind=SWE_AGENT_COMMANDS.get(name, "write"))  # type: ignore[arg-type]


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _mini_messages(raw: Any, path: Path) -> tuple[list[Message], list[ToolSchema]]:
    if not isinstance(raw, list):
        raise InputError("'messages' must be a list", path=str(path))
    messages: list[Message] = []
    pending: str | None = None  # the id of the bash call waiting for its output
    for i, m in enumerate(raw):
        role, text = m.get("role"), _text(m.get("content"))
        if role == "system":
            messages.append(Message.system(text))
        elif role == "assistant":
            blocks = _BASH_BLOCK.findall(text)
            if blocks:
                pending = f"call_{i}"
                messages.append(Message.assistant(text, [ToolCall.make("bash", {"command": blocks[-1]}, pending)]))
            else:
                messages.append(Message.assistant(text))
        elif role in ("user", "tool"):
            if pending is not None and (role == "tool" or _OUTPUT.match(text)):
                messages.append(Message.tool(text, tool_call_id=pending, name="bash"))
                pending = None
            else:
                messages.append(Message.user(text))
        else:
            raise InputError(f"message {i}: unknown role {role!r}", path=str(path))
    return messages, [_schema("bash")]


def _swe_agent_messages(data: dict[str, Any], path: Path) -> tuple[list[Message], list[ToolSchema]]:
    history = [h for h in data.get("history") or [] if h.get("agent", "primary") == "primary"]
    opening = [Message.system(_text(h.get("content"))) if h.get("role") == "system" else Message.user(_text(h.get("content")))
               for h in history[:2] if h.get("role") in ("system", "user")]
    messages = list(opening)
    used: list[str] = []
    for i, step in enumerate(data["trajectory"]):
        action = str(step.get("action", "")).strip()
        word = action.split(maxsplit=1)[0] if action else "bash"
        name = word if word in SWE_AGENT_COMMANDS else "bash"
        if name not in used:
            used.append(name)
        call = ToolCall.make(name, {"command": action}, f"call_{i}")
        messages.append(Message.assistant(_text(step.get("thought")) or None, [call]))
        messages.append(Message.tool(_text(step.get("observation")), tool_call_id=call.id, name=name))
    if not data["trajectory"]:
        raise InputError("the SWE-agent trajectory has no steps", path=str(path))
    return messages, [_schema(n) for n in used]


def predictions(trajectories: Iterable[Trajectory], model: str) -> list[dict[str, str]]:
    """SWE-bench predictions of the trajectories that carry an `instance_id` and a `model_patch`."""
    out = []
    for t in trajectories:
        instance, patch = t.info.get("instance_id"), t.info.get("model_patch")
        if instance is None or patch is None:
            continue
        out.append({"instance_id": str(instance), "model_name_or_path": model, "model_patch": str(patch)})
    return out


def write_predictions(trajectories: Iterable[Trajectory], path: str | Path, model: str) -> int:
    """Write SWE-bench's predictions JSONL (atomically); returns how many."""
    rows = predictions(trajectories, model)
    atomic_write_text(Path(path), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


def read_predictions(path: str | Path) -> list[dict[str, str]]:
    """A predictions JSONL, each line checked to have the three keys as strings."""
    path = Path(path)
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON ({e.msg})", path=str(path), line=lineno) from None
        missing = [k for k in PREDICTION_KEYS if not isinstance(row.get(k), str)] if isinstance(row, dict) else list(PREDICTION_KEYS)
        if missing:
            raise InputError(f"a prediction needs {', '.join(missing)} as strings", path=str(path), line=lineno)
        rows.append(row)
    return rows
