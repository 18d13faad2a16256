"""The τ²-bench side of the live τ²-bench target: a process that plays episodes with τ²-bench's code.

Run by `tracerl.envs.tau2_live` as `PYTHON tau2_bridge.py` with a Python (≥ 3.12) that has τ²-bench
installed; it imports only the standard library and τ²-bench, never tracerl. One JSON request per
line on stdin, one JSON answer per line on stdout ({"ok": true, ...} or {"ok": false, "error": ...}).

An episode is τ²-bench's own half-duplex `Orchestrator` over the domain's `Environment`, its
`UserSimulator` (litellm, any OpenAI-compatible endpoint) and, as the agent, τ²-bench's `GymAgent`
(the agent of `tau2.gym`: the domain's tools plus `done`; a `done` call or "###STOP###" ends the
episode) fed one assistant message per `step` instead of through its thread handshake. The episode
ends as τ²-bench ends it and is graded by `evaluate_simulation`; with a restricted reward basis the
task's `reward_basis` is replaced before grading, and the NL-assertion judge is τ²-bench's own,
pointed at the configured endpoint.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from copy import deepcopy
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]  # tracerl's tau2.py is not τ²-bench
PROTOCOL = os.fdopen(os.dup(1), "w", encoding="utf-8")  # answers; fd 1 goes to stderr (litellm prints)
os.dup2(2, 1)
sys.stdout = sys.stderr

try:
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=os.environ.get("TRACERL_TAU2_LOG_LEVEL", "ERROR"))
    import tau2
    from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT
    from tau2.data_model.message import (
        AssistantMessage,
        ToolCall,
        ToolMessage,
        UserMessage,
    )
    from tau2.data_model.simulation import TerminationReason
    from tau2.data_model.tasks import RewardType
    from tau2.environment.toolkit import get_tool_types
    from tau2.evaluator import evaluator_nl_assertions
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.gym.gym_agent import GymAgent
    from tau2.orchestrator.orchestrator import Orchestrator, Role
    from tau2.registry import registry
    from tau2.runner.build import build_environment, build_user
    from tau2.utils import DATA_DIR
    from tau2.utils.utils import get_now
except ImportError as e:  # reported by the first request, so the caller gets one clear line
    IMPORT_ERROR: str | None = f"{type(e).__name__}: {e}"
    GymAgent = object  # type: ignore[assignment,misc]
else:
    IMPORT_ERROR = None

PREMATURE = {"max_steps", "timeout", "too_many_errors"}


class StepAgent(GymAgent):
    """τ²-bench's GymAgent whose next message is handed over by `step`, not awaited in a thread."""

    def __init__(self, tools: list[Any], domain_policy: str):
        super().__init__(tools=tools, domain_policy=domain_policy)
        self.pending: AssistantMessage | None = None

    def generate_next_message(self, message: Any, state: Any) -> tuple[AssistantMessage, Any]:
        if self.pending is None:
            raise RuntimeError("the agent was asked for a message it was not given")
        if hasattr(message, "tool_messages"):
            state.messages.extend(message.tool_messages)
        elif message is not None:
            state.messages.append(message)
        reply, self.pending = self._check_if_stop_toolcall(self.pending), None
        state.messages.append(reply)
        return reply, state


def system_prompt(policy: str) -> str:
    """What τ²-bench's LLMAgent puts in its system message."""
    return SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=AGENT_INSTRUCTION)


def litellm_target(endpoint: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(model, llm_args) for litellm from {model, base_url, api_key, temperature, max_tokens, tool_choice}."""
    args: dict[str, Any] = {"temperature": float(endpoint.get("temperature", 0.0))}
    if endpoint.get("max_tokens"):
        args["max_tokens"] = int(endpoint["max_tokens"])
    if endpoint.get("tool_choice"):
        args["tool_choice"] = endpoint["tool_choice"]
    model = endpoint["model"]
    if endpoint.get("base_url"):
        model = model if model.startswith("openai/") else f"openai/{model}"
        args["api_base"] = endpoint["base_url"]
        args["api_key"] = endpoint.get("api_key") or "none"
    elif endpoint.get("api_key"):
        args["api_key"] = endpoint["api_key"]
    return model, args


class Episode:
    def __init__(self, req: dict[str, Any]):
        domain, task_id = req["domain"], str(req["task_id"])
        tasks = tasks_of(domain)
        if task_id not in tasks:
            raise ValueError(f"no task '{task_id}' in τ²-bench domain '{domain}'")
        self.domain = domain
        self.task = deepcopy(tasks[task_id])
        basis = req.get("reward_basis")
        if basis and self.task.evaluation_criteria is not None:
            self.task.evaluation_criteria.reward_basis = [RewardType(b) for b in basis]
        self.judge = req.get("judge")
        environment = build_environment(domain)
        self.agent = StepAgent(environment.get_tools(), environment.get_policy())
        model, args = litellm_target(req["user"])
        user = build_user("user_simulator", environment, self.task, llm=model, llm_args=args)
        self.orch = Orchestrator(domain=domain, agent=self.agent, user=user, environment=environment,
                                 task=self.task, max_steps=int(req["max_steps"]), max_errors=int(req["max_errors"]),
                                 seed=req.get("seed"), simulation_id=req.get("simulation_id"))
        self.call_names: dict[str, str] = {}
        self.seen = 0
        self.error: str | None = None
        self.orch._run_start_time = get_now()  # what Orchestrator.run() sets before initialize()
        self.orch._run_start_perf = time.perf_counter()
        self.orch.initialize()
        history = list(self.orch.trajectory)
        for m in history:  # the calls of a task's message history, so its tool messages get names
            for call in getattr(m, "tool_calls", None) or []:
                self.call_names[call.id] = call.name

    def advance(self) -> None:
        """Run the orchestrator until the agent is to speak or the episode is over."""
        orch = self.orch
        try:
            while not orch.done and orch.to_role != Role.AGENT:
                orch.step()
                orch._check_termination()
        except Exception as e:  # a user-simulator call that failed: τ²-bench's infrastructure error
            traceback.print_exc(file=sys.stderr)  # into the bridge's log
            orch.done = True
            orch.termination_reason = TerminationReason.INFRASTRUCTURE_ERROR
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]

    def act(self, message: dict[str, Any]) -> None:
        calls = []
        for i, c in enumerate(message.get("tool_calls") or []):
            fn = c.get("function", {})
            raw = fn.get("arguments") or "{}"
            try:
                args = json.loads(raw) if isinstance(raw, str) else raw
            except json.JSONDecodeError:
                args = None
            if not isinstance(args, dict):  # the environment answers "Error: … unexpected keyword argument …"
                args = {"arguments_not_a_json_object": raw}
            call_id = c.get("id") or f"call_{self.orch.step_count}_{i}"
            self.call_names[call_id] = fn.get("name", "")
            calls.append(ToolCall(id=call_id, name=fn.get("name", ""), arguments=args))
        content = message.get("content")
        reply = AssistantMessage(role="assistant", content=content if content else None, tool_calls=calls or None,
                                 timestamp=get_now())
        orch = self.orch
        if not (reply.has_text_content() or reply.is_tool_call()):  # τ²-bench: an empty message is an agent error
            orch.trajectory.append(reply)
            orch.done, orch.termination_reason = True, TerminationReason.AGENT_ERROR
            return
        self.agent.pending = reply
        orch.step()
        orch._check_termination()
        self.advance()

    def observation(self) -> list[dict[str, Any]]:
        """The messages the agent has not seen yet, in OpenAI format: user text, its own tool results and,
        at reset only, the assistant messages the conversation opens with (the greeting, a task's history)."""
        out = []
        opening = self.seen == 0
        new = self.orch.trajectory[self.seen:]
        self.seen = len(self.orch.trajectory)
        for m in new:
            if isinstance(m, UserMessage) and not m.is_tool_call() and m.content:
                out.append({"role": "user", "content": m.content})
            elif isinstance(m, ToolMessage) and m.requestor == "assistant":
                out.append({"role": "tool", "tool_call_id": m.id, "name": self.call_names.get(m.id, ""),
                            "content": m.content or ""})
            elif isinstance(m, AssistantMessage) and opening:
                out.append(openai_assistant(m))
        return out

    def finish(self) -> dict[str, Any]:
        orch = self.orch
        run = orch._finalize()
        if self.judge:
            model, args = litellm_target(self.judge)
            evaluator_nl_assertions.DEFAULT_LLM_NL_ASSERTIONS = model
            evaluator_nl_assertions.DEFAULT_LLM_NL_ASSERTIONS_ARGS = args
        else:
            evaluator_nl_assertions.DEFAULT_LLM_NL_ASSERTIONS = "tracerl-no-judge-configured"
        try:
            reward_info = evaluate_simulation(simulation=run, task=self.task, evaluation_type=EvaluationType.ALL,
                                              solo_mode=False, domain=self.domain)
        except Exception as e:
            raise RuntimeError(f"τ²-bench's evaluator failed: {type(e).__name__}: {e}") from None
        run.reward_info = reward_info
        return {"termination": run.termination_reason.value, "reward": float(reward_info.reward),
                "reward_info": json.loads(reward_info.model_dump_json()),
                "simulation": json.loads(run.model_dump_json()), "error": self.error}


_TASKS: dict[str, dict[str, Any]] = {}


def tasks_of(domain: str) -> dict[str, Any]:
    if domain not in _TASKS:
        _TASKS[domain] = {t.id: t for t in registry.get_tasks_loader(domain)()}
    return _TASKS[domain]


def openai_assistant(m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                              "arguments": json.dumps(c.arguments, ensure_ascii=False)}} for c in m.tool_calls]
    return out


def domain_info(req: dict[str, Any]) -> dict[str, Any]:
    domain = req["domain"]
    if domain not in registry.get_domains():
        raise ValueError(f"unknown τ²-bench domain '{domain}' (known: {', '.join(sorted(registry.get_domains()))})")
    environment = build_environment(domain)
    agent = StepAgent(environment.get_tools(), environment.get_policy())
    kinds = {name: t.value for name, t in get_tool_types(environment.tools).items()}
    tasks = list(tasks_of(domain).values())
    try:
        splits = registry.get_task_splits_loader(domain)()
    except Exception:
        splits = {"base": [t.id for t in tasks]}
    return {
        "domain": domain,
        "system_prompt": system_prompt(environment.get_policy()),
        "tools": [t.openai_schema for t in agent.tools],
        "tool_kinds": kinds,
        "tasks": [t.id for t in tasks],
        "splits": {k: [str(i) for i in v] for k, v in splits.items()},
        "reward_basis": {t.id: [b.value for b in t.evaluation_criteria.reward_basis] if t.evaluation_criteria else []
                         for t in tasks},
        "gold_actions": {t.id: [{"name": a.name, "arguments": a.arguments}
                                for a in (t.evaluation_criteria.actions or []) if a.requestor == "assistant"]
                         if t.evaluation_criteria else [] for t in tasks},
        "communicate_info": {t.id: list(t.evaluation_criteria.communicate_info or []) if t.evaluation_criteria else []
                             for t in tasks},
    }


def results(req: dict[str, Any]) -> dict[str, Any]:
    """A τ²-bench results document (its own `Results` model) of finished simulations, as `tau2 run`
    writes one: the tasks played, each simulation with its trial number, who played the agent and the user."""
    from tau2.data_model.simulation import (
        AgentInfo,
        Info,
        Results,
        SimulationRun,
        UserInfo,
    )

    domain = req["domain"]
    tasks = tasks_of(domain)
    simulations = [SimulationRun.model_validate(s) for s in req["simulations"]]
    played = list(dict.fromkeys(s.task_id for s in simulations))
    user_model, user_args = litellm_target(req["user"])
    user_args.pop("api_key", None)  # a results file is shared; keys stay out of it
    agent = req["agent"]
    info = Info(git_commit="", num_trials=int(req["num_trials"]), max_steps=int(req["max_steps"]),
                max_errors=int(req["max_errors"]), seed=req.get("seed"),
                user_info=UserInfo(implementation="user_simulator", llm=user_model, llm_args=user_args),
                agent_info=AgentInfo(implementation=agent["implementation"], llm=agent.get("llm"),
                                     llm_args=agent.get("llm_args")),
                environment_info=build_environment(domain).get_info())
    document = Results(info=info, tasks=[tasks[t] for t in played], simulations=simulations)
    return {"results": json.loads(document.model_dump_json())}


def handle(req: dict[str, Any], episodes: dict[str, Episode]) -> dict[str, Any]:
    op = req.get("op")
    if IMPORT_ERROR is not None:
        raise ImportError(f"τ²-bench is not importable by {sys.executable} ({IMPORT_ERROR})")
    if op == "hello":
        return {"version": getattr(tau2, "__version__", None) or _version(), "python": sys.version.split()[0],
                "data_dir": str(DATA_DIR), "domains": sorted(registry.get_domains())}
    if op == "domain":
        return domain_info(req)
    if op in ("reset", "step"):
        if op == "reset":
            episode = episodes[req["episode"]] = Episode(req)
            episode.advance()
        else:
            episode = episodes[req["episode"]]
            episode.act(req["message"])
        out = {"messages": episode.observation(), "done": episode.orch.done}
        if episode.orch.done:
            out.update(episode.finish())
            episodes.pop(req["episode"], None)
        return out
    if op == "results":
        return results(req)
    if op == "close":
        episodes.pop(req.get("episode"), None)
        return {}
    raise ValueError(f"unknown op '{op}'")


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tau2")
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
        PROTOCOL.write(json.dumps(answer, ensure_ascii=False) + "\n")
        PROTOCOL.flush()


if __name__ == "__main__":
    main()
