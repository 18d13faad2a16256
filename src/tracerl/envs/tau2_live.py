"""The live τ²-bench target: `make_env("tau2:retail", user=…)` plays τ²-bench's own episodes.

τ²-bench (github.com/sierra-research/tau2-bench) needs Python ≥ 3.12 and is not on the package
index, so it runs in its own process (`tau2_bridge.py`, one per Python and data folder, started on
first use) and this module speaks to it over a pipe. Everything of an episode but the agent is
τ²-bench's: the domain's environment and tools, its user simulator (litellm, any OpenAI-compatible
endpoint), its orchestrator's turn-taking and termination, and its evaluator. The agent is the
tracerl policy: it sees τ²-bench's agent system prompt, the opening greeting, the user's turns and
its tool results, and it ends an episode as in `tau2.gym` (the `done` tool or "###STOP###"), or
the user ends it. Its messages and token records stay tracerl's.

Settings (`Tau2Settings`): the user simulator and the NL-assertion judge endpoints, the reward
basis (None = each task's own; e.g. ["DB"] restricts it), task ids, τ²-bench's max_steps and
max_errors, the Python that has τ²-bench and its data folder. Every result records the basis,
the user simulator and the judge it was graded with. Problems found before any episode (unknown
domain or task, τ²-bench missing, an endpoint that does not answer, a basis that needs a judge
none is configured for) raise a one-line `InputError`.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tracerl.core.config_file import load_config_file
from tracerl.core.errors import InputError
from tracerl.core.io import atomic_write_text
from tracerl.core.messages import Action, Message
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory
from tracerl.envs.base import Env, StepResult
from tracerl.envs.bridge import BridgeError, BridgeProcess
from tracerl.envs.endpoint import Endpoint, check_endpoint

BRIDGE = Path(__file__).with_name("tau2_bridge.py")
INSTALL_HINT = ("install τ²-bench (Python ≥ 3.12): PYTHON -m pip install 'tau2 @ git+https://github.com/"
                "sierra-research/tau2-bench' and name that Python in tau2.python or $TRACERL_TAU2_PYTHON")
RewardBasis = Literal["DB", "ENV_ASSERTION", "ACTION", "COMMUNICATE", "NL_ASSERTION"]
PREMATURE = {"max_steps", "timeout"}


class Tau2Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: Endpoint | None = Field(None, description="τ²-bench's user simulator runs on this endpoint (required)")
    judge: Endpoint | None = Field(None, description="the NL-assertion judge; needed when the basis has NL_ASSERTION")
    reward_basis: list[RewardBasis] | None = Field(None, description="None = each task's own basis; e.g. [DB]")
    task_ids: list[str] | None = Field(None, description="play these tasks whatever the split (default: the split's)")
    splits: dict[str, list[str]] | None = Field(None, description="task ids per split, in place of the domain's "
                                                "split_tasks.json (e.g. for mock, which has only 'base')")
    max_steps: int = Field(200, ge=1, description="τ²-bench's limit on messages in an episode")
    max_errors: int = Field(10, ge=1, description="τ²-bench's limit on tool errors in an episode")
    python: str | None = Field(None, description="a Python ≥ 3.12 with τ²-bench (default: $TRACERL_TAU2_PYTHON, "
                               "this Python, .venv-tau2/bin/python)")
    data_dir: str | None = Field(None, description="τ²-bench's data folder (default: $TAU2_DATA_DIR, else τ²-bench's own)")
    check_endpoints: bool = Field(True, description="ask each endpoint's /models before the first episode")


# --- the bridge process -----------------------------------------------------------------------

class Bridge(BridgeProcess):
    """One τ²-bench process (`tau2_bridge.py`), with the domains it has described."""
    def __init__(self, python: str, data_dir: str | None):
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "True")}  # litellm
        if data_dir:                                                     # fetches a price list at import otherwise
            env["TAU2_DATA_DIR"] = os.path.abspath(data_dir)
        super().__init__(BRIDGE, python, name="τ²-bench", hint=INSTALL_HINT, env=env)
        self.domains: dict[str, dict[str, Any]] = {}

    def domain(self, name: str) -> dict[str, Any]:
        if name not in self.domains:
            self.domains[name] = self.request("domain", domain=name)
        return self.domains[name]


Tau2Error = BridgeError  # an error τ²-bench's process reported

_BRIDGES: dict[tuple[str, str | None], Bridge] = {}


def bridge_for(python: str, data_dir: str | None) -> Bridge:
    data_dir = data_dir or os.environ.get("TAU2_DATA_DIR") or None
    key = (python, os.path.abspath(data_dir) if data_dir else None)
    if key not in _BRIDGES:
        bridge = Bridge(python, data_dir)
        bridge.hello_info = bridge.hello()  # type: ignore[attr-defined]
        _BRIDGES[key] = bridge
    return _BRIDGES[key]


@atexit.register
def close_bridges() -> None:
    for bridge in _BRIDGES.values():
        bridge.close()
    _BRIDGES.clear()


def find_python(setting: str | None) -> str:
    """The Python that runs τ²-bench: the setting, $TRACERL_TAU2_PYTHON, this one (≥ 3.12), a .venv-tau2."""
    chosen = setting or os.environ.get("TRACERL_TAU2_PYTHON")
    if chosen:  # a relative path is the caller's (the bridge runs elsewhere); symlinks kept: venvs are symlinks
        return os.path.abspath(chosen) if os.sep in chosen else chosen
    if sys.version_info >= (3, 12):
        return sys.executable
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        candidate = root / ".venv-tau2" / "bin" / "python"
        if candidate.exists():
            return str(candidate)
    raise InputError(f"τ²-bench needs Python ≥ 3.12 (this is {sys.version.split()[0]}); {INSTALL_HINT}")


# --- the environment ------------------------------------------------------------------------

class Tau2Env(Env):
    """One τ²-bench domain as a tracerl `Env`; `reset(seed)` plays task `task_ids[seed % n]`
    (or `options["task_id"]`), with `seed` as τ²-bench's simulation seed."""
    def __init__(self, domain: str, split: str | None, settings: Tau2Settings):
        self.settings = settings
        self.bridge = bridge_for(find_python(settings.python), settings.data_dir)
        try:
            self.info = self.bridge.domain(domain)
        except Tau2Error as e:
            raise InputError(f"tau2:{domain}: {e}") from None
        self.name = domain
        self.task_ids = self._tasks(split)
        self.max_turns = settings.max_steps
        kinds = self.info["tool_kinds"]
        self._tools = [ToolSchema.from_openai(t) for t in self.info["tools"]]
        for t in self._tools:
            t.kind = kinds.get(t.name) if kinds.get(t.name) in ("read", "write") else "generic"  # type: ignore[assignment]
        self._check_basis()
        if settings.user is None:
            raise InputError(f"tau2:{domain}: no user simulator configured (tau2.user: model, base_url, …)")
        if settings.check_endpoints:
            check_endpoint("tau2.user", settings.user)
            if settings.judge is not None and self._needs_judge():
                check_endpoint("tau2.judge", settings.judge)
        self.episode: str | None = None
        self.simulation: dict[str, Any] | None = None

    def _tasks(self, split: str | None) -> list[str]:
        known, splits = self.info["tasks"], self.info["splits"]
        if self.settings.task_ids:
            missing = [t for t in self.settings.task_ids if t not in known]
            if missing:
                raise InputError(f"tau2:{self.name}: no task {', '.join(map(repr, missing))} (it has {len(known)} tasks)")
            return list(self.settings.task_ids)
        if self.settings.splits:
            splits = self.settings.splits
            unknown = [t for ids in splits.values() for t in ids if t not in known]
            if unknown:
                raise InputError(f"tau2:{self.name}: tau2.splits names no task {unknown[0]!r} (it has {len(known)} tasks)")
        if split is None or split == "base":
            return list(splits.get("base", known))
        if split not in splits:
            raise InputError(f"tau2:{self.name}: no split '{split}' (its splits: {', '.join(splits)})")
        return list(splits[split])

    def _basis(self, task_id: str) -> list[str]:
        return list(self.settings.reward_basis) if self.settings.reward_basis else list(self.info["reward_basis"][task_id])

    def _needs_judge(self) -> bool:
        return any("NL_ASSERTION" in self._basis(t) for t in self.task_ids)

    def _check_basis(self) -> None:
        if self.settings.judge is None and self._needs_judge():
            count = sum("NL_ASSERTION" in self._basis(t) for t in self.task_ids)
            raise InputError(f"tau2:{self.name}: {count} of {len(self.task_ids)} tasks are graded with NL_ASSERTION, "
                             "which needs a judge: configure tau2.judge or restrict tau2.reward_basis (e.g. [DB])")

    @property
    def tools(self) -> list[ToolSchema]:
        return [t.model_copy() for t in self._tools]

    @property
    def system_prompt(self) -> str:
        """τ²-bench's agent system prompt of this domain (its instructions and the domain policy)."""
        return self.info["system_prompt"]

    def oracle(self, seed: int) -> list[Action]:
        """The gold actions of the task `seed` plays (τ²-bench's `evaluation_criteria.actions`), no episode played."""
        return [Action.model_validate(a) for a in self.info["gold_actions"][self.task_ids[seed % len(self.task_ids)]]]

    def task_seeds(self, n: int, offset: int = 0) -> list[int]:
        """Seed i plays task `task_ids[i]`: the first n tasks of the split, each once."""
        if n < 0 or offset < 0 or offset + n > len(self.task_ids):
            raise ValueError(f"tau2:{self.name} has {len(self.task_ids)} tasks here; asked for {n} from offset {offset}")
        return list(range(offset, offset + n))

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        options = dict(options or {})
        seed = 0 if seed is None else int(seed)
        task_id = str(options.get("task_id") or self.task_ids[seed % len(self.task_ids)])
        if task_id not in self.info["reward_basis"]:
            raise ValueError(f"no task '{task_id}' in τ²-bench domain '{self.name}'")
        if self.episode is not None:
            self.bridge.request("close", episode=self.episode)
        self.episode, self.simulation = uuid.uuid4().hex, None
        assert self.settings.user is not None
        answer = self.bridge.request(
            "reset", episode=self.episode, domain=self.name, task_id=task_id, seed=seed,
            user=self.settings.user.for_bridge(), judge=self.settings.judge.for_bridge() if self.settings.judge else None,
            reward_basis=self.settings.reward_basis, max_steps=self.settings.max_steps,
            max_errors=self.settings.max_errors, simulation_id=self.episode)
        self._done = False
        self._early = answer if answer["done"] else None  # ended before the agent spoke (e.g. the user simulator failed)
        messages = [Message.system(self.info["system_prompt"])] + [Message.model_validate(m) for m in answer["messages"]]
        info = {
            "task_id": task_id,
            "gold_actions": self.info["gold_actions"][task_id],
            "communicate_info": self.info["communicate_info"][task_id],
            "source": "tau2-live",
            "reward_basis": self._basis(task_id),
            "user_simulator": self.settings.user.describe(),
            "judge": self.settings.judge.describe() if self.settings.judge else None,
            "tau2_version": self.bridge.hello_info.get("version"),  # type: ignore[attr-defined]
        }
        return messages, info

    def step(self, message: Message) -> StepResult:
        if self._done or self.episode is None:
            raise RuntimeError("step() after the episode ended; call reset()")
        if message.role != "assistant":
            raise ValueError(f"step() takes an assistant message, got role '{message.role}'")
        answer = self._early or self.bridge.request("step", episode=self.episode, message=message.to_openai())
        new = [] if self._early else [Message.model_validate(m) for m in answer["messages"]]
        if not answer["done"]:
            return new, 0.0, False, False, {}
        self._done, self.episode = True, None
        self.simulation = answer["simulation"]
        reward_info = answer["reward_info"] or {}
        termination = answer["termination"]
        breakdown = {str(k): float(v) for k, v in (reward_info.get("reward_breakdown") or {}).items() if v is not None}
        info = {"termination": termination, "reward_breakdown": breakdown, "reward_info": reward_info,
                "trajectory_info": {"tau2_simulation": self.simulation}}
        if answer.get("error"):  # what broke the episode (e.g. the user simulator's reply), kept with it
            info["error"] = info["trajectory_info"]["tau2_error"] = answer["error"]
        truncated = termination in PREMATURE
        return new, float(answer["reward"]), not truncated, truncated, info

    def results_document(self, trajectories: list[Trajectory], agent: str) -> dict[str, Any]:
        """τ²-bench's results document (`tau2.data_model.simulation.Results`) of episodes this domain
        played live, as `tau2 run` saves one: readable by τ²-bench's own tools (`tau2 view`, its
        metrics). `agent` names the policy. Trials are numbered per task in the order given."""
        simulations, trial = [], Counter[str]()
        for t in trajectories:
            simulation = t.info.get("tau2_simulation")
            if t.domain != self.name or not simulation:
                raise ValueError(f"trajectory of task {t.task_id} was not played live on tau2:{self.name}")
            simulations.append({**simulation, "trial": trial[t.task_id]})
            trial[t.task_id] += 1
        assert self.settings.user is not None
        answer = self.bridge.request(
            "results", domain=self.name, simulations=simulations, user=self.settings.user.for_bridge(),
            agent={"implementation": "tracerl", "llm": agent}, num_trials=max(trial.values(), default=1),
            max_steps=self.settings.max_steps, max_errors=self.settings.max_errors)
        return answer["results"]


def write_tau2_results(path: str | Path, env: Tau2Env, trajectories: list[Trajectory], agent: str) -> None:
    """Write τ²-bench's results file of live episodes (atomically)."""
    atomic_write_text(Path(path), json.dumps(env.results_document(trajectories, agent), ensure_ascii=False, indent=2))


def make_tau2_env(domain: str, split: str | None = None, **settings: Any) -> Tau2Env:
    """The factory behind `make_env("tau2:<domain>", split=…, user={…}, reward_basis=[…], …)`."""
    try:
        parsed = Tau2Settings.model_validate(settings)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(f"tau2 settings: {where}: {first['msg']}") from None
    return Tau2Env(domain, split, parsed)


def load_tau2_settings(path: str | Path) -> dict[str, Any]:
    """A YAML file of `Tau2Settings` (a run config's `target.tau2`), checked; relative paths are the file's."""
    settings = load_config_file(Tau2Settings, path)
    here = Path(path).resolve().parent
    for key in ("python", "data_dir"):
        value = getattr(settings, key)
        if value and os.sep in value and not Path(value).is_absolute():
            setattr(settings, key, os.path.normpath(here / value))
    return settings.model_dump()
