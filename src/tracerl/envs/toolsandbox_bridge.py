"""ToolSandBox's side of the live ToolSandBox target: run with a Python that has ToolSandBox.

ToolSandBox (github.com/apple/ToolSandbox) pins old libraries (numpy 1.26, polars 0.20, pydantic
2.7, openai 1.17, transformers 4.41), so it lives in a virtual environment of its own and tracerl
(`tracerl.envs.toolsandbox`) speaks to this script over a pipe: one JSON request per line on stdin,
one JSON answer per line on stdout (anything ToolSandBox prints goes to stderr). This file imports
nothing from tracerl.

Each episode is ToolSandBox's own `Scenario.play_and_evaluate`, run in a thread of its own, with
three roles: ToolSandBox's `ExecutionEnvironment`; its `OpenAIAPIUser` (the user simulator), whose
OpenAI client points at the configured endpoint instead of the hard-wired api.openai.com (its
requests get the configured temperature, token cap and the episode's seed); and its
`OpenAIAPIAgent`, whose one model call (`model_inference`) hands the conversation and tool schemas
to tracerl and returns tracerl's message as the completion. So turn-taking, the conversion of tool
calls into the Python it executes, the message limit, the user ending the conversation and the
milestone/minefield evaluation are ToolSandBox's, unchanged. An episode that raises (the agent
names a tool the scenario does not offer, or writes arguments that are not JSON; the user
simulator fails) is scored as ToolSandBox's own runner (`tool_sandbox.cli.utils.run_scenario`)
scores it: similarity 0, with the exception recorded.

ToolSandBox keeps the conversation in one process-wide execution context. Episodes take turns
strictly (the pipe answers one request at a time, and an episode's thread runs only while its
request is being answered), and an episode's thread sets its own context again each time it
resumes, so episodes in flight do not see each other's.

Scenarios: the 129 base scenarios (`named_scenarios`, those tagged NO_DISTRACTION_TOOLS; the
augmented copies with distraction tools or scrambled names are left out), minus the 38 whose tool
allow list names a tool of `tool_sandbox.tools.rapid_api_search_tools` (it calls RapidAPI: needs
a key and the network). `random` is seeded with 42 before the scenarios are built, as ToolSandBox's
CLI does, so each scenario lists its tools in the CLI's order.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]  # tracerl's envs/ is not ToolSandBox's
PROTOCOL = os.fdopen(os.dup(1), "w", encoding="utf-8")  # answers; fd 1 goes to stderr
os.dup2(2, 1)
sys.stdout = sys.stderr
os.environ.setdefault("TQDM_DISABLE", "1")  # Scenario.play's progress bar

try:
    import random

    import attrs
    import polars as pl
    import tool_sandbox.tools
    from openai import OpenAI
    from openai.types.chat import ChatCompletion, ChatCompletionMessage
    from openai.types.chat.chat_completion import Choice
    from openai.types.chat.chat_completion_message_tool_call import ChatCompletionMessageToolCall, Function
    from tool_sandbox.cli.utils import get_category_summary
    from tool_sandbox.common.execution_context import (
        DatabaseNamespace, RoleType, ScenarioCategories, get_current_context, set_current_context,
    )
    from tool_sandbox.common.tool_conversion import convert_to_openai_tools
    from tool_sandbox.common.tool_discovery import ToolBackend, find_tools_by_module
    from tool_sandbox.roles.execution_environment import ExecutionEnvironment
    from tool_sandbox.roles.openai_api_agent import OpenAIAPIAgent
    from tool_sandbox.roles.openai_api_user import OpenAIAPIUser
    from tool_sandbox.scenarios import named_scenarios
except ImportError as e:  # reported by the first request, so the caller gets one clear line
    IMPORT_ERROR: str | None = f"{type(e).__name__}: {e}"
    OpenAIAPIAgent = OpenAIAPIUser = object  # type: ignore[assignment,misc]
else:
    IMPORT_ERROR = None

RAPID_API_MODULE = "tool_sandbox.tools.rapid_api_search_tools"
WRITES = ("add_to_database", "update_database", "remove_from_database", "set_boolean_settings(")
READS = ("get_database", "get_boolean_settings(")


class EpisodeClosed(Exception):
    """Raised inside an episode's thread to stop it (the episode was closed before it ended)."""


# --- the roles ---------------------------------------------------------------------------------

class _Completions:
    """`client.chat.completions` with defaults added to every request (temperature, max_tokens, seed) and,
    to those that offer tools, `tool_choice`."""

    def __init__(self, inner: Any, defaults: dict[str, Any], tool_choice: str | None):
        self.inner, self.defaults, self.tool_choice = inner, defaults, tool_choice

    def create(self, **kwargs: Any) -> Any:
        extra = {"tool_choice": self.tool_choice} if self.tool_choice and isinstance(kwargs.get("tools"), list) else {}
        return self.inner.create(**{**self.defaults, **extra, **kwargs})


class _Client:
    def __init__(self, client: Any, defaults: dict[str, Any], tool_choice: str | None):
        self.chat = type("Chat", (), {})()
        self.chat.completions = _Completions(client.chat.completions, defaults, tool_choice)


class EndpointUser(OpenAIAPIUser):
    """ToolSandBox's OpenAI user simulator on a configured endpoint: its `respond` and (retrying)
    `model_inference` unchanged, its client's base URL, key and request defaults ours."""

    def __init__(self, endpoint: dict[str, Any], seed: int | None):
        self.model_name = endpoint["model"]
        client = OpenAI(base_url=endpoint.get("base_url") or "https://api.openai.com/v1",
                        api_key=endpoint.get("api_key") or "none", max_retries=0)
        defaults: dict[str, Any] = {"temperature": float(endpoint.get("temperature", 0.0))}
        if endpoint.get("max_tokens"):
            defaults["max_tokens"] = int(endpoint["max_tokens"])
        if seed is not None:
            defaults["seed"] = int(seed)
        self.openai_client = _Client(client, defaults, endpoint.get("tool_choice"))  # type: ignore[assignment]

    def respond(self, ending_index: int | None = None) -> None:
        try:
            super().respond(ending_index=ending_index)
        except EpisodeClosed:
            raise
        except Exception as e:
            e.tracerl_role = "user"  # type: ignore[attr-defined]
            raise


class StepAgent(OpenAIAPIAgent):
    """ToolSandBox's OpenAI agent role whose model is tracerl: `model_inference` hands the agent's
    view of the conversation to the episode (which answers tracerl's request with it) and waits for
    tracerl's message."""

    model_name = "tracerl"

    def __init__(self, episode: Episode):
        self.episode = episode

    def respond(self, ending_index: int | None = None) -> None:
        try:
            super().respond(ending_index=ending_index)
        except EpisodeClosed:
            raise
        except Exception as e:
            e.tracerl_role = "agent"  # type: ignore[attr-defined]
            raise

    def model_inference(self, openai_messages: list[dict[str, Any]], openai_tools: Any) -> ChatCompletion:
        context = get_current_context()
        message = self.episode.agent_turn(openai_messages, openai_tools)
        set_current_context(context)  # other episodes ran meanwhile
        return self.episode.completion(message)


# --- an episode -----------------------------------------------------------------------------

class Episode:
    """One scenario played in a thread; `start` and `act` return when tracerl is to speak or it ended."""

    def __init__(self, req: dict[str, Any]):
        name = str(req["scenario"])
        if name not in SCENARIOS:
            raise ValueError(f"no offline base scenario '{name}' in ToolSandBox")
        self.name = name
        self.scenario = SCENARIOS[name]
        if req.get("max_messages"):  # the scenario with another message limit (its own evaluation reads it too)
            self.scenario = attrs.evolve(self.scenario, max_messages=int(req["max_messages"]))
        self.seed = req.get("seed")
        self.user = req["user"]
        self.to_main: queue.Queue = queue.Queue()
        self.to_thread: queue.Queue = queue.Queue()
        self.seen = 0  # agent-view messages handed over already
        self.ids: dict[str, str] = {}  # the call ids ToolSandBox executes under -> tracerl's
        self.calls = 0
        self.tools: list[dict[str, Any]] | None = None
        self.thread: threading.Thread | None = None

    # the main thread's side
    def start(self) -> dict[str, Any]:
        self.thread = threading.Thread(target=self._play, name=f"episode-{self.name}", daemon=True)
        self.thread.start()
        return self.to_main.get()

    def act(self, message: dict[str, Any]) -> dict[str, Any]:
        self.to_thread.put(message)
        return self.to_main.get()

    def close(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            self.to_thread.put(None)
            self.to_main.get()

    # the episode thread's side
    def agent_turn(self, openai_messages: list[dict[str, Any]], openai_tools: Any) -> dict[str, Any]:
        new = []
        for m in openai_messages[self.seen:]:
            if m["role"] == "assistant":
                continue  # tracerl's own message, which it keeps
            m = dict(m)
            if m["role"] == "tool":
                m["tool_call_id"] = self.ids.get(m["tool_call_id"], m["tool_call_id"])
            new.append(m)
        self.seen = len(openai_messages)
        if self.tools is None and isinstance(openai_tools, list):
            self.tools = openai_tools
        self.to_main.put({"done": False, "messages": new, "tools": self.tools})
        message = self.to_thread.get()
        if message is None:
            raise EpisodeClosed()
        return message

    def completion(self, message: dict[str, Any]) -> ChatCompletion:
        """tracerl's OpenAI-format message as the chat completion OpenAIAPIAgent reads. Call ids become
        Python identifiers where they are not (ToolSandBox executes `<id>_parameters = …`); tool
        results are handed back under tracerl's ids."""
        calls = []
        for c in message.get("tool_calls") or []:
            self.calls += 1
            given = str(c.get("id") or "")
            call_id = given if given.isidentifier() else f"call_tracerl_{self.calls}"
            self.ids[call_id] = given or call_id
            fn = c.get("function") or {}
            arguments = fn.get("arguments")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments if arguments is not None else {})
            calls.append(ChatCompletionMessageToolCall(id=call_id, type="function",
                                                       function=Function(name=str(fn.get("name", "")), arguments=arguments)))
        reply = ChatCompletionMessage(role="assistant", content=message.get("content"), tool_calls=calls or None)
        return ChatCompletion(id=f"tracerl-{self.calls}", object="chat.completion", created=int(time.time()),
                              model="tracerl", choices=[Choice(index=0, finish_reason="stop", message=reply)])

    def _play(self) -> None:
        """ToolSandBox's `play_and_evaluate`, scored as its runner scores an episode (`run_scenario`)."""
        output = tempfile.mkdtemp(prefix="episode-", dir=WORKDIR)
        scenario = self.scenario
        answer: dict[str, Any] = {"done": True, "conversation": None, "error": None}
        roles: dict[Any, Any] = {}
        try:
            roles = {RoleType.USER: EndpointUser(self.user, self.seed), RoleType.EXECUTION_ENVIRONMENT: ExecutionEnvironment(),
                     RoleType.AGENT: StepAgent(self)}
            result = scenario.play_and_evaluate(roles=roles, output_directory=Path(output), scenario_name=self.name)
            evaluation = result.evaluation_result
            sandbox = result.ending_context.get_database(DatabaseNamespace.SANDBOX)
            answer["termination"] = "max_messages" if sandbox["conversation_active"][-1] else "user_stop"
            answer["result"] = {
                "name": self.name, "categories": [str(c) for c in scenario.categories], "traceback": None,
                "exception_type": None, "milestone_similarity": evaluation.milestone_similarity,
                "minefield_similarity": evaluation.minefield_similarity, "similarity": evaluation.similarity,
                "turn_count": evaluation.turn_count,
                "milestone_mapping": _mapping(evaluation.milestone_mapping),
                "minefield_mapping": _mapping(evaluation.minefield_mapping),
            }
            conversation = os.path.join(output, "trajectories", self.name, "conversation.json")
            with open(conversation, encoding="utf-8") as f:
                answer["conversation"] = json.load(f)
        except EpisodeClosed:
            answer = {"done": True, "closed": True}
        except Exception as e:
            traceback.print_exc(file=sys.stderr)  # into the bridge's log
            role = getattr(e, "tracerl_role", None)
            answer["termination"] = {"agent": "agent_error", "user": "user_error"}.get(role, "error")
            answer["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
            answer["result"] = {
                "name": self.name, "categories": [str(c) for c in scenario.categories],
                "traceback": traceback.format_exc(), "exception_type": type(e).__name__,
                "milestone_similarity": 0, "minefield_similarity": 0, "similarity": 0,
                "turn_count": scenario.max_messages, "milestone_mapping": {}, "minefield_mapping": {},
            }
        finally:
            for role in roles.values():
                role.teardown()
            shutil.rmtree(output, ignore_errors=True)
        self.to_main.put(answer)


def _mapping(mapping: Any) -> dict[str, list[float]]:
    """{milestone index: (snapshot index, similarity)} as JSON (keys become strings, as json.dump writes them)."""
    return {str(k): [v[0], v[1]] for k, v in mapping.items()}


# --- the scenarios ---------------------------------------------------------------------------

SCENARIOS: dict[str, Any] = {}
LEFT_OUT: dict[str, str] = {}
WORKDIR = tempfile.mkdtemp(prefix="tracerl-toolsandbox-")


def load_scenarios() -> None:
    if SCENARIOS or LEFT_OUT:
        return
    random.seed(42)  # as ToolSandBox's CLI, before it builds the scenarios (tool order in each allow list)
    tools = find_tools_by_module(tool_sandbox.tools, preferred_tool_backend=ToolBackend.DEFAULT)
    rapid = {name for name, f in tools.items() if inspect.getmodule(f).__name__ == RAPID_API_MODULE}
    for name, scenario in named_scenarios(preferred_tool_backend=ToolBackend.DEFAULT).items():
        if ScenarioCategories.NO_DISTRACTION_TOOLS not in scenario.categories:
            continue  # an augmented copy of a base scenario
        needs = sorted(set(scenario.starting_context.tool_allow_list or []) & rapid)
        if needs:
            LEFT_OUT[name] = f"calls RapidAPI ({', '.join(needs)}): needs a key and the network"
        else:
            SCENARIOS[name] = scenario


def tool_kind(function: Any) -> str:
    """'write' when the tool changes a ToolSandBox database, 'read' when it reads one, else 'generic'."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return "generic"
    if any(w in source for w in WRITES):
        return "write"
    return "read" if any(r in source for r in READS) else "generic"


def agent_tools(scenario: Any) -> list[dict[str, Any]]:
    """The OpenAI tool schemas the agent is offered in `scenario` (as OpenAIAPIAgent builds them)."""
    previous = get_current_context()
    set_current_context(scenario.starting_context)
    try:
        return convert_to_openai_tools(StepAgent.get_available_tools())
    finally:
        set_current_context(previous)


def milestone_steps(scenario: Any) -> list[dict[str, Any]]:
    """What the scenario's milestones name of the agent, in milestone order: tool calls (the tool traces its
    calls must match: {"call": {name, arguments}}) and words to the user ({"say": text}). Milestones on the
    world's state (a setting turned off) name neither."""
    out: list[dict[str, Any]] = []
    for milestone in scenario.evaluation.milestone_matcher.milestones:
        for constraint in milestone.snapshot_constraints:
            frame = constraint.target_dataframe
            if constraint.database_namespace != DatabaseNamespace.SANDBOX or frame is None:
                continue
            if "tool_trace" in frame.columns:
                for trace in frame["tool_trace"].to_list():
                    for item in trace if isinstance(trace, list) else [trace]:
                        parsed = json.loads(item) if isinstance(item, str) else item
                        for call in parsed if isinstance(parsed, list) else [parsed]:
                            call = json.loads(call) if isinstance(call, str) else call
                            out.append({"call": {"name": call["tool_name"], "arguments": call.get("arguments", {})}})
            elif "content" in frame.columns and frame["sender"].to_list() == [RoleType.AGENT] \
                    and frame["recipient"].to_list() == [RoleType.USER]:
                out.append({"say": frame["content"][0]})
    return out


def opening_system(scenario: Any) -> str:
    frame = scenario.starting_context.get_database(DatabaseNamespace.SANDBOX, get_all_history_snapshots=True)
    rows = frame.filter((pl.col("sender") == RoleType.SYSTEM) & (pl.col("recipient") == RoleType.AGENT))
    return "\n".join(rows["content"].to_list())


@functools.lru_cache(maxsize=1)
def info() -> dict[str, Any]:
    load_scenarios()
    tools = find_tools_by_module(tool_sandbox.tools, preferred_tool_backend=ToolBackend.DEFAULT)
    per_scenario = {name: agent_tools(s) for name, s in SCENARIOS.items()}
    used = {t["function"]["name"] for schemas in per_scenario.values() for t in schemas}
    offered = [name for name in tools if name in used]  # every tool an offline scenario offers, in ToolSandBox's order
    union = {t["function"]["name"]: t for schemas in per_scenario.values() for t in schemas}
    return {
        "scenarios": list(SCENARIOS),
        "left_out": dict(LEFT_OUT),
        "categories": {name: [str(c) for c in s.categories] for name, s in SCENARIOS.items()},
        "system_prompt": {name: opening_system(s) for name, s in SCENARIOS.items()},
        "tools": [union[name] for name in offered],
        "tool_kinds": {name: tool_kind(tools[name]) for name in offered},
        "scenario_tools": {name: [t["function"]["name"] for t in schemas] for name, schemas in per_scenario.items()},
        "milestone_steps": {name: milestone_steps(s) for name, s in SCENARIOS.items()},
        "max_messages": {name: s.max_messages for name, s in SCENARIOS.items()},
    }


def summary(req: dict[str, Any]) -> dict[str, Any]:
    """result_summary.json's content as ToolSandBox's CLI writes it (`write_result_summary`), from result rows."""
    rows = req["results"]
    categories = get_category_summary(rows)
    return {"per_scenario_results": rows,
            "category_aggregated_results": {category: {k: sum(v) / len(v) for k, v in aggregation.items()}
                                            for category, aggregation in categories.items()},
            "git_sha": None}


# --- the protocol -----------------------------------------------------------------------------

def handle(req: dict[str, Any], episodes: dict[str, Episode]) -> dict[str, Any]:
    op = req.get("op")
    if IMPORT_ERROR is not None:
        raise ImportError(f"ToolSandBox is not importable by {sys.executable} ({IMPORT_ERROR})")
    if op == "hello":
        return {"version": _version(), "python": sys.version.split()[0]}
    if op == "info":
        return info()
    if op == "reset":
        load_scenarios()
        old = episodes.pop(req["episode"], None)
        if old is not None:
            old.close()
        episode = episodes[req["episode"]] = Episode(req)
        answer = episode.start()
    elif op == "step":
        episode = episodes[req["episode"]]
        answer = episode.act(req["message"])
    elif op == "close":
        episode = episodes.pop(req["episode"], None)
        if episode is not None:
            episode.close()
        return {}
    elif op == "summary":
        return summary(req)
    else:
        raise ValueError(f"unknown op '{op}'")
    if answer["done"]:
        episodes.pop(req["episode"], None)
    return answer


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tool_sandbox")
    except PackageNotFoundError:
        return None


def main() -> None:
    episodes: dict[str, Episode] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        req: dict[str, Any] = {}
        try:
            req = json.loads(line)
            answer = {"ok": True, **handle(req, episodes)}
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0][:1000]}
        answer["id"] = req.get("id") if isinstance(req, dict) else None
        PROTOCOL.write(json.dumps(answer, ensure_ascii=False, default=str) + "\n")
        PROTOCOL.flush()
    for episode in list(episodes.values()):
        episode.close()


if __name__ == "__main__":
    main()
