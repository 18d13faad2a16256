"""The environment protocol (Gymnasium's shape, chat messages as observations and actions).

    messages, info = env.reset(seed=7)            # system prompt + the user's opening turn
    messages, reward, terminated, truncated, info = env.step(assistant_message)

Same seed ⇒ the same task instance, bit for bit. A bad tool call (unknown tool, malformed JSON,
wrong argument types) comes back as an "Error: …" tool message, never as an exception. Reward is
0.0 until the episode ends; `max_turns` assistant turns end a runaway episode (truncated, reward 0).

`info` from reset carries `task_id` and, where the environment knows them, `gold_actions` and
`communicate_info` (`tracerl.core.trajectory.Trajectory` lists every key a trajectory may carry);
rollouts save it whole. `options={"hint": True}` asks for the task's expert guidance
(`hint(seed)`) in the system prompt; a reset of the same seed without it gives the same opening
without the guidance, which is how a trainer strips it.

Optional, where the environment can say them: `oracle(seed)` (the gold tool calls) and
`user_requests(seed)` (the user's requests with the writes that serve them, and whether the
domain's rules allow each) — synthesis reads a target's own requests from it; and, for a benchmark
played live, `write_results(path, trajectories, agent)` (its episodes in the benchmark's own results
format, e.g. a ToolSandBox run folder).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from tracerl.core.messages import Action, Message
from tracerl.core.policy import Policy
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory
from tracerl.envs.tools import Toolbox

StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]


class UserRequest(BaseModel):
    """One request of a task's user, as the domain's rules decide it."""

    model_config = ConfigDict(extra="forbid")

    text: str  # the user's words, e.g. "cancel reservation rowan because of my health"
    user_id: str | None  # the user's id, where the domain has users
    record_id: str  # the id of the record the request is about
    write: Action | None  # the write that serves it (where the rules forbid it: the write it would be)
    allowed: bool  # whether the domain's rules allow it


class Env(ABC):
    name: str = "env"
    max_turns: int = 30

    @property
    @abstractmethod
    def tools(self) -> list[ToolSchema]: ...

    @abstractmethod
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]: ...

    @abstractmethod
    def step(self, message: Message) -> StepResult: ...

    def task_seeds(self, n: int, offset: int = 0) -> list[int]:
        """The first `n` task seeds this environment plays (after `offset`): a fixed, reproducible task
        set, the same for every caller. An environment with a finite task list (a split of a target)
        raises ValueError when it has fewer; here every integer seed is a task."""
        if n < 0 or offset < 0:
            raise ValueError(f"asked for {n} tasks from offset {offset}")
        return list(range(offset, offset + n))

    def oracle(self, seed: int) -> list[Action]:
        """The gold tool-call sequence that solves the task of `seed` (optional)."""
        raise NotImplementedError(f"{type(self).__name__} has no oracle")

    def hint(self, seed: int) -> str | None:
        """The expert guidance of task `seed` that `reset(seed, options={"hint": True})` puts in the system
        prompt: how to go about the task, never its answer; None when the environment has none."""
        return None

    def reference_policy(self, spec: str, seed: int = 0, **options: Any) -> Policy:
        """A scripted policy of this domain by spec — e.g. 'oracle', 'flawed:…' (optional; `tracerl collect
        --policy SPEC`). A spec the domain does not know raises ValueError."""
        raise ValueError(f"{type(self).__name__} has no reference policies")

    def user_requests(self, seed: int) -> list[UserRequest]:
        """The requests of task `seed`'s user, each with its write and whether the rules allow it (optional)."""
        raise NotImplementedError(f"{type(self).__name__} does not state its users' requests")

    def write_results(self, path: Path, trajectories: list[Trajectory], agent: str) -> bool:
        """Write `trajectories`, played here by `agent`, at `path` in the benchmark's own results format,
        for the benchmark's own tools (optional); False, writing nothing, where it has none."""
        return False


class ToolEnv(Env):
    """An Env whose agent works through a Toolbox and talks to a (scripted) user.

    Subclasses implement `_setup` (build the task and the toolbox from the seed), `_user_reply`
    (the user simulator) and `_score` (the verifiable reward). This class owns the episode
    mechanics shared by every environment: dispatching tool calls, counting turns and errors,
    truncation, termination and scoring once at the end.
    """

    max_errors: int = 10

    def __init__(self, max_turns: int | None = None):
        if max_turns is not None:
            self.max_turns = max_turns
        self._toolbox: Toolbox | None = None
        self._done = True

    # --- for subclasses -------------------------------------------------------------------
    @abstractmethod
    def _setup(self, seed: int, options: dict[str, Any]) -> tuple[Toolbox, list[Message], dict[str, Any]]:
        """Build the task of `seed`: its toolbox (bound to a fresh state), the opening messages, info."""

    @abstractmethod
    def _user_reply(self, text: str) -> tuple[str | None, bool]:
        """The user's answer to the agent's text; (reply or None, whether the user ends the chat)."""

    @abstractmethod
    def _score(self) -> tuple[float, dict[str, float]]:
        """The final reward in [0, 1] and its breakdown."""

    def _end_after_tool(self, name: str) -> bool:
        """Whether a call of tool `name` ends the episode (e.g. a transfer to a human)."""
        return False

    # --- protocol -------------------------------------------------------------------------
    @property
    def tools(self) -> list[ToolSchema]:
        if self._toolbox is None:
            self._toolbox = self._setup(0, {})[0]
        return self._toolbox.schemas

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        self.seed = 0 if seed is None else int(seed)
        self._toolbox, opening, info = self._setup(self.seed, dict(options or {}))
        self.messages: list[Message] = list(opening)
        self.turns = 0
        self.errors = 0
        self.termination: str | None = None
        self._done = False
        self._info = info
        return list(opening), dict(info)

    def step(self, message: Message) -> StepResult:
        if self._done:
            raise RuntimeError("step() after the episode ended; call reset()")
        if message.role != "assistant":
            raise ValueError(f"step() takes an assistant message, got role '{message.role}'")
        self.messages.append(message)
        self.turns += 1
        out: list[Message] = []
        if message.tool_calls:
            assert self._toolbox is not None
            for call in message.tool_calls:
                text = self._toolbox.call(call.function.name, call.function.arguments)
                out.append(Message.tool(text, tool_call_id=call.id, name=call.function.name))
                if text.startswith("Error:"):
                    self.errors += 1
                if self._end_after_tool(call.function.name):
                    self.termination = "agent_stop"
        else:
            reply, stop = self._user_reply(message.content or "")
            if reply is not None:
                out.append(Message.user(reply))
            if stop:
                self.termination = "user_stop"
        if self.termination is None and self.errors >= self.max_errors:
            self.termination = "too_many_errors"
        truncated = self.termination is None and self.turns >= self.max_turns
        if truncated:
            self.termination = "max_turns"
        self.messages.extend(out)
        terminated = self.termination is not None and not truncated
        reward, breakdown = 0.0, {}
        if terminated or truncated:
            self._done = True
            if self.termination in ("user_stop", "agent_stop"):
                reward, breakdown = self._score()
        info = {"termination": self.termination, "reward_breakdown": breakdown} if self._done else {}
        return out, reward, terminated, truncated, info

    def tool_kind(self, name: str) -> str | None:
        return self._toolbox.kind_of(name) if self._toolbox else None
