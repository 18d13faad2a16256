"""Trajectories: one episode of an agent in an environment, with outcome and token records."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracerl.core.messages import Action, Message, ToolCall, tool_calls_of
from tracerl.core.tools import ToolSchema

# τ²-bench termination reasons, plus ours ("opening": not played, the task's opening alone, as gate
# data). Only user_stop and agent_stop can score above 0.
TERMINATIONS = ("user_stop", "agent_stop", "max_turns", "max_steps", "too_many_errors", "error", "opening")


class TokenRecord(BaseModel):
    """The episode as the model saw it, built by appending turn by turn (never re-templated).

    `ids` is the whole token sequence; `logprobs[i]` is the sampling log-probability of `ids[i]`
    where `mask[i] == 1` (a token the model generated; these take loss) and 0.0 elsewhere
    (system, user and tool tokens: context). `prompt_len` is the length of the initial prompt
    (system + first user turn): a trainer that strips a hint from the sampling prompt re-templates
    only that part and keeps `ids[prompt_len:]`.
    """

    model_config = ConfigDict(extra="forbid")

    ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    mask: list[int] = Field(default_factory=list)
    prompt_len: int = 0

    @model_validator(mode="after")
    def _same_lengths(self) -> TokenRecord:
        if not (len(self.ids) == len(self.logprobs) == len(self.mask)):
            raise ValueError("ids, logprobs and mask must have the same length")
        return self


class Trajectory(BaseModel):
    """One episode. `info` carries source-specific extras under these keys (all optional):

    - `gold_actions`: list of {name, arguments} — the task's gold tool calls (τ²-bench and built-in domains)
    - `communicate_info`: strings the agent had to tell the user
    - `task_kind`: a short label of the kind of task (e.g. "cancel", "multi")
    - `reasoning_args`: [gold_action_index, argument_name] pairs whose value must be chosen or
      computed from records (a wrong value there is a reasoning error, not an imprecise call)
    - `subtasks`: the requests of a multi-request task ({kind, reservation_id, allowed})
    - `action_checks`, `db_check`, `communicate_checks`, `nl_assertions`: τ²-bench's grading
    - `tau2_simulation`: the episode as τ²-bench recorded it (a live `tau2:<domain>` target), for results files
    - `faults`: ground truth of the flawed reference policy ({drawn, planted}); labellers never read it
    - `capability`: the capability of the synthetic environment the episode came from
    - `hint`: the sampling prompt carried a hint (the trainer strips it before the gradient step)
    """

    model_config = ConfigDict(extra="forbid")

    task_id: str
    domain: str
    seed: int | None = None
    messages: list[Message]
    tools: list[ToolSchema] = Field(default_factory=list)
    reward: float = 0.0
    passed: bool = False
    reward_breakdown: dict[str, float] = Field(default_factory=dict)
    termination: str = "agent_stop"
    info: dict[str, Any] = Field(default_factory=dict)
    tokens: TokenRecord | None = None

    def tool_calls(self) -> list[ToolCall]:
        return tool_calls_of(self.messages)

    def gold_actions(self) -> list[Action] | None:
        gold = self.info.get("gold_actions")
        return None if gold is None else [Action.model_validate(a) for a in gold]

    def tool_kinds(self) -> dict[str, str]:
        return {t.name: t.kind for t in self.tools}

    @property
    def num_turns(self) -> int:
        """Assistant turns."""
        return sum(1 for m in self.messages if m.role == "assistant")


class TrajectoryGroup(BaseModel):
    """Rollouts of one task instance (same env, same seed) — a GRPO group or a calibration group."""

    model_config = ConfigDict(extra="forbid")

    seed: int
    task_id: str
    trajectories: list[Trajectory]

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]
