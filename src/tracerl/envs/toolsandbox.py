"""The live ToolSandBox target: `make_env("toolsandbox", settings=FILE)` plays ToolSandBox's own scenarios.

ToolSandBox (github.com/apple/ToolSandbox; arXiv 2408.04682) is not on the package index and pins
old libraries, so it runs in a virtual environment of its own (`toolsandbox_bridge.py`, started on
first use) and this module speaks to it over a pipe. Everything of an episode but the agent is
ToolSandBox's: the scenario's starting world (contacts, messages, reminders, settings), its tools
executed in its Python sandbox, its user simulator (on any OpenAI-compatible endpoint: upstream
hard-wires api.openai.com), its turn-taking and message limit, and its milestone/minefield
evaluation. The agent is the tracerl policy: it sees ToolSandBox's agent system prompt, the user's
turns and its tool results, with the scenario's tool schemas.

Grading: the episode's reward is ToolSandBox's similarity (milestone similarity, zeroed when a
minefield matched) and it passes when the similarity is 1 (ToolSandBox's "perfect" score). An
episode ends when the user simulator ends the conversation (`user_stop`) or the scenario's message
limit is reached (`max_messages`; still graded). An episode that raises in ToolSandBox is scored as
its own runner scores it, 0: the agent named a tool the scenario does not offer or wrote arguments
that are not JSON (`agent_error`), or the user simulator failed (`user_error`).

Settings (`ToolSandboxSettings`, a YAML file given as `settings=`, its fields as keyword options over
it): the user simulator's endpoint (a weak model there may be asked with
`tool_choice: none`: it then only speaks, and every episode runs to the message limit), the
scenarios or splits, the message limit (default: each scenario's own, 30), the Python that has
ToolSandBox. Problems found before any episode (ToolSandBox missing, an endpoint that does not
answer, an unknown or left-out scenario, an unknown split) raise a one-line `InputError`.

Scenarios: ToolSandBox's 129 base scenarios (the augmented copies with distraction tools and
scrambled names left out) less the 38 whose tools call RapidAPI (`search_lat_lon`,
`search_location_around_lat_lon`, `search_weather_around_lat_lon`, `search_stock`,
`convert_currency`: they need a key and the network) — 91 offline scenarios (contacts, messaging,
reminders, settings, time utilities, holidays). `ToolSandboxEnv.left_out` names each scenario left
out and why. Splits: `base` is all 91 in ToolSandBox's order; by default every third scenario in name
order is `test` (30) and the rest `train` (61); `toolsandbox.splits` sets others.

Reference policy: `env.reference_policy("milestone-replay")` (`MilestoneReplay`) plays what each
scenario's milestones name of the agent.

Results: `write_toolsandbox_results` (`env.write_results`) writes a folder as ToolSandBox's CLI does (`result_summary.json`,
its aggregation by category computed by ToolSandBox's own code, and `trajectories/<scenario>/
conversation.json`); `toolsandbox_trajectories` reads such a folder (ours or one ToolSandBox's CLI
wrote) into `Trajectory` records for `tracerl select` and `tracerl show`.
"""

from __future__ import annotations

import ast
import atexit
import json
import os
import re
import shutil
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tracerl.core.config_file import load_config_file
from tracerl.core.errors import InputError
from tracerl.core.messages import Action, Message, ToolCall
from tracerl.core.policy import Policy, Session
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory
from tracerl.envs.base import Env, StepResult
from tracerl.envs.bridge import BridgeError, BridgeProcess
from tracerl.envs.endpoint import Endpoint, check_endpoint
from tracerl.envs.runner import passed as reward_passes

BRIDGE = Path(__file__).with_name("toolsandbox_bridge.py")
NAME = "ToolSandBox"
INSTALL_HINT = ("install ToolSandBox in a venv of its own (Python 3.9-3.12): python3.11 -m venv .venv-toolsandbox && "
                ".venv-toolsandbox/bin/pip install 'tool_sandbox @ git+https://github.com/apple/ToolSandbox' 'httpx<0.28'; "
                "name that Python in toolsandbox.python or $TRACERL_TOOLSANDBOX_PYTHON")
TEST_EVERY = 3  # the default test split: every third offline scenario in name order
SOURCE = "toolsandbox-live"


class ToolSandboxSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: Endpoint | None = Field(None, description="ToolSandBox's user simulator runs on this endpoint (required); "
                                  "the paper's is gpt-4o-2024-05-13 (no base_url, api_key_env: OPENAI_API_KEY)")
    scenarios: list[str] | None = Field(None, description="play these scenarios whatever the split (default: the split's)")
    splits: dict[str, list[str]] | None = Field(None, description="scenario names per split, in place of the default "
                                                "(test: every third offline scenario in name order; train: the others)")
    max_messages: int | None = Field(None, ge=2, description="ToolSandBox's limit on an episode's messages, in place of "
                                     "each scenario's own (30 in every offline scenario)")
    python: str | None = Field(None, description="a Python with ToolSandBox (default: $TRACERL_TOOLSANDBOX_PYTHON, "
                               ".venv-toolsandbox/bin/python)")
    check_endpoints: bool = Field(True, description="ask the user simulator's /models before the first episode")


# --- the bridge process ----------------------------------------------------------------------

_BRIDGES: dict[str, BridgeProcess] = {}


def bridge_for(python: str) -> BridgeProcess:
    if python not in _BRIDGES:
        bridge = BridgeProcess(BRIDGE, python, name=NAME, hint=INSTALL_HINT, env={"TQDM_DISABLE": "1"})
        bridge.hello_info = bridge.hello()  # type: ignore[attr-defined]
        _BRIDGES[python] = bridge
    return _BRIDGES[python]


@atexit.register
def close_bridges() -> None:
    for bridge in _BRIDGES.values():
        bridge.close()
    _BRIDGES.clear()


def find_python(setting: str | None) -> str:
    """The Python that runs ToolSandBox: the setting, $TRACERL_TOOLSANDBOX_PYTHON, a .venv-toolsandbox."""
    chosen = setting or os.environ.get("TRACERL_TOOLSANDBOX_PYTHON")
    if chosen:  # a relative path is the caller's (the bridge runs elsewhere); symlinks kept: venvs are symlinks
        return os.path.abspath(chosen) if os.sep in chosen else chosen
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        candidate = root / ".venv-toolsandbox" / "bin" / "python"
        if candidate.exists():
            return str(candidate)
    raise InputError(f"no Python with ToolSandBox found; {INSTALL_HINT}")


_INFO: dict[str, dict[str, Any]] = {}


def default_splits(names: list[str]) -> dict[str, list[str]]:
    """`base`: every offline scenario in ToolSandBox's order; `test`: every third in name order; `train`: the rest."""
    ordered = sorted(names)
    test = set(ordered[TEST_EVERY - 1::TEST_EVERY])
    return {"base": list(names), "train": [n for n in ordered if n not in test], "test": [n for n in ordered if n in test]}


# --- the environment ----------------------------------------------------------------------------

class ToolSandboxEnv(Env):
    """ToolSandBox's offline base scenarios as a tracerl `Env`; `reset(seed)` plays scenario
    `task_ids[seed % n]` (or `options["task_id"]`), with `seed` as the user simulator's sampling seed."""

    name = "toolsandbox"

    def __init__(self, split: str | None, settings: ToolSandboxSettings):
        self.settings = settings
        self.bridge = bridge_for(find_python(settings.python))
        python = self.bridge.python
        if python not in _INFO:
            _INFO[python] = self.bridge.request("info")
        self.info = _INFO[python]
        self.left_out: dict[str, str] = dict(self.info["left_out"])
        self.task_ids = self._tasks(split)
        self.max_turns = settings.max_messages or max(self.info["max_messages"].values())
        kinds = self.info["tool_kinds"]
        self._all_tools = [ToolSchema.from_openai(t) for t in self.info["tools"]]
        for t in self._all_tools:
            t.kind = kinds.get(t.name, "generic")
        self._tools = self._all_tools
        if settings.user is None:
            raise InputError("toolsandbox: no user simulator configured (toolsandbox.user: model, base_url, …)")
        if settings.check_endpoints:
            check_endpoint("toolsandbox.user", settings.user)
        self.episode: str | None = None
        self._done = True

    def _tasks(self, split: str | None) -> list[str]:
        known = self.info["scenarios"]

        def check(names: list[str], where: str) -> None:
            for name in names:
                if name in self.left_out:
                    raise InputError(f"toolsandbox: {where} names scenario '{name}', which is left out: {self.left_out[name]}")
                if name not in known:
                    raise InputError(f"toolsandbox: {where} names no scenario '{name}' ({len(known)} offline base scenarios)")

        if self.settings.scenarios:
            check(self.settings.scenarios, "toolsandbox.scenarios")
            return list(self.settings.scenarios)
        splits = default_splits(known)
        if self.settings.splits:
            for ids in self.settings.splits.values():
                check(ids, "toolsandbox.splits")
            splits = {"base": splits["base"], **self.settings.splits}
        split = split or "base"
        if split not in splits:
            raise InputError(f"toolsandbox: no split '{split}' (its splits: {', '.join(splits)})")
        return list(splits[split])

    @property
    def tools(self) -> list[ToolSchema]:
        """The current scenario's tools (after a reset), else every tool an offline scenario offers."""
        return [t.model_copy() for t in self._tools]

    @property
    def system_prompt(self) -> str:
        """ToolSandBox's agent system prompt (the same in every offline base scenario)."""
        return self.info["system_prompt"][self.task_ids[0]]

    def oracle(self, seed: int) -> list[Action]:
        """The tool calls the scenario's milestones name (their tool traces), in milestone order, no
        episode played. A scenario whose milestones constrain only the world's state (a setting
        turned off) or the agent's words names none."""
        return [Action.model_validate(a) for a in self.gold_actions(self.task_ids[seed % len(self.task_ids)])]

    def gold_actions(self, name: str) -> list[dict[str, Any]]:
        """The tool calls scenario `name`'s milestones name ({name, arguments}), in milestone order."""
        return [step["call"] for step in self.info["milestone_steps"][name] if "call" in step]

    def task_seeds(self, n: int, offset: int = 0) -> list[int]:
        """Seed i plays scenario `task_ids[i]`: the first n scenarios of the split, each once."""
        if n < 0 or offset < 0 or offset + n > len(self.task_ids):
            raise ValueError(f"toolsandbox has {len(self.task_ids)} scenarios here; asked for {n} from offset {offset}")
        return list(range(offset, offset + n))

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        options = dict(options or {})
        seed = 0 if seed is None else int(seed)
        name = str(options.get("task_id") or self.task_ids[seed % len(self.task_ids)])
        if name not in self.info["milestone_steps"]:
            raise ValueError(f"no offline base scenario '{name}' in ToolSandBox")
        if self.episode is not None:
            self.bridge.request("close", episode=self.episode)
        self.episode = uuid.uuid4().hex
        assert self.settings.user is not None
        answer = self.bridge.request("reset", episode=self.episode, scenario=name, seed=seed,
                                     user=self.settings.user.for_bridge(), max_messages=self.settings.max_messages)
        self._done = False
        self._early = answer if answer["done"] else None
        offered = set(self.info["scenario_tools"][name])
        self._tools = [t for t in self._all_tools if t.name in offered]
        messages = [Message.model_validate(m) for m in answer.get("messages", [])]
        if not messages or messages[0].role != "system":
            messages.insert(0, Message.system(self.info["system_prompt"][name]))
        info = {
            "task_id": name,
            "gold_actions": self.gold_actions(name),
            "milestone_steps": self.info["milestone_steps"][name],
            "categories": self.info["categories"][name],
            "source": SOURCE,
            "user_simulator": self.settings.user.describe(),
            "toolsandbox_version": self.bridge.hello_info.get("version"),  # type: ignore[attr-defined]
        }
        return messages, info

    def step(self, message: Message) -> StepResult:
        if self._done or self.episode is None:
            raise RuntimeError("step() after the episode ended; call reset()")
        if message.role != "assistant":
            raise ValueError(f"step() takes an assistant message, got role '{message.role}'")
        answer = self._early or self.bridge.request("step", episode=self.episode, message=message.to_openai())
        new = [] if self._early else [Message.model_validate(m) for m in answer.get("messages", [])]
        if not answer["done"]:
            return new, 0.0, False, False, {}
        self._done, self.episode = True, None
        result = answer["result"]
        termination = answer["termination"]
        breakdown = {"milestone_similarity": float(result["milestone_similarity"]),
                     "minefield_similarity": float(result["minefield_similarity"])}
        info: dict[str, Any] = {"termination": termination, "reward_breakdown": breakdown,
                                "trajectory_info": {"toolsandbox_result": result,
                                                    "toolsandbox_conversation": answer.get("conversation")}}
        if answer.get("error"):
            info["error"] = info["trajectory_info"]["toolsandbox_error"] = answer["error"]
        truncated = termination == "max_messages"
        return new, float(result["similarity"]), not truncated, truncated, info

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """result_summary.json's content for these result rows, aggregated by ToolSandBox's own code."""
        return self.bridge.request("summary", results=rows)

    def write_results(self, path: Path, trajectories: list[Trajectory], agent: str) -> bool:
        """The episodes as a ToolSandBox run folder at `path` (`write_toolsandbox_results`)."""
        write_toolsandbox_results(path, self, trajectories)
        return True

    def reference_policy(self, spec: str, seed: int = 0, **options: Any) -> Policy:
        """'milestone-replay' (or 'oracle'): `MilestoneReplay`; 'milestone-replay:say' keeps only its words
        (it drops the calls), 'milestone-replay:call' only its calls."""
        name, _, keep = spec.partition(":")
        if name not in ("milestone-replay", "oracle") or keep not in ("", "say", "call"):
            raise ValueError(f"toolsandbox's reference policies are milestone-replay[:say|:call] and oracle, not '{spec}'")
        return MilestoneReplay(drop=("call",) if keep == "say" else ("say",) if keep == "call" else ())


class MilestoneReplay:
    """A reference agent for ToolSandBox: it plays what the scenario's milestones name of the agent
    (`info["milestone_steps"]`: its tool calls and its words to the user), in order, one per turn
    (the k-th turn plays the k-th step), then closes politely. `drop` leaves out the steps of those
    kinds ("call", "say"). Where the milestones name every change the scenario wants (no milestone on a
    state reached by an unnamed call) and the simulated user lets the agent finish, ToolSandBox grades
    it perfect."""

    name = "milestone-replay"
    CLOSING = "Is there anything else I can help you with?"

    def __init__(self, drop: tuple[str, ...] = ()):
        self.drop = drop

    def act(self, sessions: list[Session]) -> list[Message]:
        out = []
        for s in sessions:
            steps = [step for step in s.info["milestone_steps"] if not any(k in step for k in self.drop)]
            k = sum(m.role == "assistant" for m in s.messages)
            if k >= len(steps):
                out.append(Message.assistant(self.CLOSING))
            elif "call" in steps[k]:
                call = steps[k]["call"]
                out.append(Message.assistant(None, [ToolCall.make(call["name"], call["arguments"], f"call_{k}")]))
            else:
                out.append(Message.assistant(steps[k]["say"]))
        return out


def make_toolsandbox_env(split: str | None = None, settings: str | Path | None = None, **options: Any) -> ToolSandboxEnv:
    """The factory behind `make_env("toolsandbox", split=…, settings=FILE, user={…}, …)`: the settings of
    the YAML file `settings` (`load_toolsandbox_settings`), with `options` over them."""
    try:
        parsed = ToolSandboxSettings.model_validate({**(load_toolsandbox_settings(settings) if settings else {}),
                                                     **options})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(f"toolsandbox settings: {where}: {first['msg']}") from None
    try:
        return ToolSandboxEnv(split, parsed)
    except BridgeError as e:
        raise InputError(f"toolsandbox: {e}") from None


def load_toolsandbox_settings(path: str | Path) -> dict[str, Any]:
    """A YAML file of `ToolSandboxSettings` (a run config's `target.toolsandbox`), checked; a relative
    `python` path is the file's."""
    settings = load_config_file(ToolSandboxSettings, path)
    value = settings.python
    if value and os.sep in value and not Path(value).is_absolute():
        settings.python = os.path.normpath(Path(path).resolve().parent / value)
    return settings.model_dump()


# --- results: ToolSandBox's own folder layout ---------------------------------------------------

def write_toolsandbox_results(folder: str | Path, env: ToolSandboxEnv, trajectories: list[Trajectory]) -> list[Path]:
    """Write episodes played live as ToolSandBox's CLI writes a run: `result_summary.json` and
    `trajectories/<scenario>/conversation.json` (for an episode that raised, where ToolSandBox writes
    none, the conversation as the agent saw it). A scenario played k times is k runs: folders
    `trial_0` … `trial_<k-1>` under `folder` (one trial: `folder` itself). Each run folder is
    written under a temporary name, then renamed. Returns the run folders."""
    trials: list[list[Trajectory]] = []
    count: Counter[str] = Counter()
    for t in trajectories:
        result = t.info.get("toolsandbox_result")
        if t.info.get("source") != SOURCE or not result:
            raise ValueError(f"trajectory of scenario {t.task_id} was not played live on toolsandbox")
        k = count[t.task_id]
        count[t.task_id] += 1
        while len(trials) <= k:
            trials.append([])
        trials[k].append(t)
    folder = Path(folder)
    runs = [folder] if len(trials) <= 1 else [folder / f"trial_{k}" for k in range(len(trials))]
    for run, episodes in zip(runs, trials, strict=True):
        run.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{run.name}.", dir=run.parent))
        try:
            summary = env.summary([t.info["toolsandbox_result"] for t in episodes])
            (tmp / "result_summary.json").write_text(json.dumps(summary, indent=4, ensure_ascii=False), encoding="utf-8")
            for t in episodes:
                conversation = t.info.get("toolsandbox_conversation") or [
                    m.to_openai() for m in t.messages]
                where = tmp / "trajectories" / t.task_id
                where.mkdir(parents=True)
                (where / "conversation.json").write_text(json.dumps(conversation, indent=2, ensure_ascii=False),
                                                         encoding="utf-8")
            if run.exists():
                shutil.rmtree(run)
            tmp.rename(run)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return runs


def is_toolsandbox_results(doc: Any) -> bool:
    """Whether a parsed JSON document is ToolSandBox's `result_summary.json`."""
    return isinstance(doc, dict) and isinstance(doc.get("per_scenario_results"), list)


def toolsandbox_trajectories(doc: dict[str, Any], *, path: str, tools: list[ToolSchema] | None = None) -> list[Trajectory]:
    """One trajectory per row of a `result_summary.json` (`path`): the conversation from
    `trajectories/<scenario>/conversation.json` beside it, or, where ToolSandBox wrote none (the
    episode raised), rebuilt from `execution_context.json` as the agent saw it. Reward: the row's
    similarity; passed: similarity 1. `tools` gives schemas; without them, each tool the agent called
    gets a schema with its name only."""
    root = Path(path).parent
    out = []
    for i, row in enumerate(doc["per_scenario_results"]):
        where = f"per_scenario_results[{i}]"
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            raise InputError(f"{where}: not a scenario result (no 'name')", path=path)
        folder = root / "trajectories" / row["name"]
        context = _read_json(folder / "execution_context.json", path)
        conversation = _read_json(folder / "conversation.json", path)
        if conversation is None and context is None:
            raise InputError(f"{where}: neither conversation.json nor execution_context.json in {folder}", path=path)
        try:
            messages = _conversation_messages(conversation) if conversation is not None else _context_messages(context)
            similarity = float(row.get("similarity") or 0.0)
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"{where} ({row['name']}): {type(e).__name__}: {e}", path=path) from None
        termination = "error" if row.get("exception_type") else _ending(context)
        called = sorted({c.function.name for m in messages for c in m.tool_calls or []})
        schemas = [t.model_copy() for t in tools] if tools else [ToolSchema(name=n, description="") for n in called]
        info = {"categories": row.get("categories", []), "source": "toolsandbox", "toolsandbox_result": row}
        if row.get("exception_type"):
            info["error"] = row["exception_type"]
        out.append(Trajectory(
            task_id=row["name"], domain="toolsandbox", messages=messages, tools=schemas, reward=similarity,
            passed=reward_passes(similarity), termination=termination, info=info,
            reward_breakdown={k: float(row[k]) for k in ("milestone_similarity", "minefield_similarity")
                              if isinstance(row.get(k), (int, float))},
        ))
    return out


def _read_json(file: Path, path: str) -> Any:
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{file}: not valid JSON ({e})", path=path) from None


def _conversation_messages(turns: list[dict[str, Any]]) -> list[Message]:
    """conversation.json's turns (OpenAI messages with `<role>_details` beside them) as messages."""
    keep = ("role", "content", "tool_calls", "tool_call_id", "name")
    out = []
    for turn in turns:
        message = {k: turn[k] for k in keep if turn.get(k) is not None}
        if message.get("tool_calls"):
            message["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["function"]["name"],
                                                   "arguments": c["function"].get("arguments") or "{}"}}
                                     for c in message["tool_calls"]]
            message["content"] = message.get("content") or None
        out.append(Message.model_validate(message))
    return out


_CALL_CODE = re.compile(r"^(?P<id>.+)_parameters = (?P<arguments>[^\n]+)\n(?P=id)_response = (?P<name>[^\(]+)")


def _context_messages(context: dict[str, Any]) -> list[Message]:
    """The agent's side of the conversation in an execution_context.json (its SANDBOX database), as
    ToolSandBox's `to_openai_messages` reads it: system and user turns to the agent, the agent's calls
    (consecutive ones in one message) and words, the tool results it got."""
    rows = context["_dbs"]["SANDBOX"]
    out: list[Message] = []
    for i, row in enumerate(rows):
        sender, recipient = row.get("sender"), row.get("recipient")
        if sender is None or row.get("visible_to") == ["USER"] or "AGENT" not in (sender, recipient):
            continue
        content = row.get("content") or ""
        if (sender, recipient) == ("SYSTEM", "AGENT"):
            out.append(Message.system(content))
        elif (sender, recipient) == ("USER", "AGENT"):
            out.append(Message.user(content))
        elif (sender, recipient) == ("AGENT", "USER"):
            out.append(Message.assistant(content))
        elif (sender, recipient) == ("AGENT", "EXECUTION_ENVIRONMENT"):
            call = _code_call(content, row.get("openai_tool_call_id") or f"call_{i}", row.get("openai_function_name"))
            if out and out[-1].role == "assistant" and out[-1].tool_calls:
                out[-1].tool_calls.append(call)
            else:
                out.append(Message.assistant(None, [call]))
        elif (sender, recipient) == ("EXECUTION_ENVIRONMENT", "AGENT"):
            last = next((m for m in reversed(out) if m.tool_calls), None)
            call_id = row.get("openai_tool_call_id") or (last.tool_calls[-1].id if last and last.tool_calls else f"call_{i}")
            name = row.get("openai_function_name") or (last.tool_calls[-1].function.name if last and last.tool_calls else "")
            out.append(Message.tool(content, tool_call_id=call_id, name=name))
    return out


def _code_call(code: str, call_id: str, name: str | None) -> ToolCall:
    """The tool call in the Python an agent's call became (`python_code_to_openai_tool_call`); code in
    another shape (a person at ToolSandBox's CLI) keeps its first called name and the code itself."""
    match = _CALL_CODE.match(code)
    if match:
        arguments = ast.literal_eval(match.group("arguments"))
        return ToolCall.make(name or match.group("name"), arguments, call_id)
    called = re.findall(r"(\w+)\(", code)
    tool = name or next((c for c in called if c not in ("print", "repr")), "python")
    return ToolCall.make(tool, {"code": code}, call_id)


def _ending(context: dict[str, Any] | None) -> str:
    """user_stop or max_messages from the execution context's last SANDBOX row; 'unknown' without one."""
    if context is None:
        return "unknown"
    rows = [r for r in context["_dbs"]["SANDBOX"] if r.get("sender") is not None]
    return "user_stop" if rows and rows[-1].get("conversation_active") is False else "max_messages"
