"""`AirlineEnv`: the built-in τ²-style target domain (offline, deterministic).

Reward as in τ²-bench: replay the agent's write calls on a fresh database built from the seed
and compare its hash with the hash after the gold actions (DB), times the communicate check —
every required string appears in some assistant message (case-insensitive, commas ignored, as a
whole word — see `mentions`).
Pass iff reward == 1.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from tracerl.core.messages import Action, Message
from tracerl.core.tools import ToolSchema
from tracerl.envs.airline.data_model import AirlineDB
from tracerl.envs.airline.policy import HINT, POLICY
from tracerl.envs.airline.reference import (
    ScriptedAirlinePolicy,
    scripted_policy_from_spec,
)
from tracerl.envs.airline.tasks import SPLITS, AirlineTask, generate_task, task_seeds
from tracerl.envs.airline.tools import AirlineTools
from tracerl.envs.airline.user import airline_user
from tracerl.envs.base import ToolEnv, UserRequest
from tracerl.envs.prompts import with_hint
from tracerl.envs.tools import Toolbox


class AirlineEnv(ToolEnv):
    """The airline domain. `split` ("train" / "test" / None) restricts which task seeds reset accepts."""

    name = "airline"
    max_turns = 30

    def __init__(self, split: str | None = None, max_turns: int | None = None):
        super().__init__(max_turns=max_turns)
        if split is not None and split not in SPLITS:
            raise ValueError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)})")
        self.split = split
        self.task: AirlineTask | None = None
        self._tools = AirlineTools()

    @property
    def tools(self) -> list[ToolSchema]:
        return self._tools.schemas

    def task_seeds(self, n: int, offset: int = 0) -> list[int]:
        return task_seeds(self.split, n, offset) if self.split is not None else super().task_seeds(n, offset)

    def _setup(self, seed: int, options: dict[str, Any]) -> tuple[Toolbox, list[Message], dict[str, Any]]:
        if self.split is not None and seed not in SPLITS[self.split]:
            seeds = SPLITS[self.split]
            raise ValueError(f"seed {seed} is not in the {self.split} split [{seeds.start}, {seeds.stop})")
        self.task = generate_task(seed)
        self.user = airline_user(self.task)
        self._tools.bind(_copy(self.task.db))
        system = with_hint(POLICY, HINT) if options.get("hint") else POLICY
        return self._tools, [Message.system(system), Message.user(self.user.opening())], self.task.info()

    def _user_reply(self, text: str) -> tuple[str | None, bool]:
        return self.user.reply(text)

    def _end_after_tool(self, name: str) -> bool:
        return name == "transfer_to_human_agents"

    def _score(self) -> tuple[float, dict[str, float]]:
        assert self.task is not None
        agent_writes = [
            Action(name=call.function.name, arguments=call.parsed_arguments() or {})
            for m in self.messages if m.role == "assistant" for call in (m.tool_calls or [])
            if self._tools.kind_of(call.function.name) == "write" and call.parsed_arguments() is not None
        ]
        db = 1.0 if replay(self.task.db, agent_writes) == replay(self.task.db, self.task.gold_actions) else 0.0
        said = [m.content or "" for m in self.messages if m.role == "assistant"]
        communicate = 1.0 if all(any(mentions(s, c) for s in said) for c in self.task.communicate_info) else 0.0
        return db * communicate, {"DB": db, "COMMUNICATE": communicate}

    def oracle(self, seed: int) -> list[Action]:
        return generate_task(seed).gold_actions

    def reference_policy(self, spec: str, seed: int = 0, **options: Any) -> ScriptedAirlinePolicy:
        """'oracle' or 'flawed[:p1,…]' (`tracerl.envs.airline.reference`)."""
        return scripted_policy_from_spec(spec, seed=seed, **options)

    def hint(self, seed: int) -> str:
        return HINT

    def user_requests(self, seed: int) -> list[UserRequest]:
        """Each request of the task; a forbidden one with the write a policy ignoring the rule makes (bag
        requests are always allowed)."""
        task = generate_task(seed)
        return [UserRequest(text=sub.request, user_id=task.user_id, record_id=sub.reservation_id,
                            write=next(iter(sub.writes if sub.allowed else sub.anyway_writes), None), allowed=sub.allowed)
                for sub in task.subtasks]


def mentions(text: str, info: str) -> bool:
    """τ²-bench's communicate check (case-insensitive, commas ignored), on whole words: '280' counts
    in 'refund of $280.' but not inside 'gift_card_2801'."""
    needle = re.escape(info.lower().replace(",", ""))
    return re.search(rf"(?<!\w){needle}(?!\w)", text.lower().replace(",", "")) is not None


def replay(initial: AirlineDB, actions: list[Action]) -> str:
    """The digest of `initial` (left untouched) after running `actions`; failing calls change nothing."""
    tools = _replay_tools().bind(_copy(initial))
    for action in actions:
        tools.call(action.name, action.arguments)
    return tools.db.digest()


@functools.cache
def _replay_tools() -> AirlineTools:
    """One toolbox for all replays (building one derives nine argument models; rebinding is free)."""
    return AirlineTools()


def _copy(db: AirlineDB) -> AirlineDB:
    """An independent copy (dump + validate: three times faster than a deep copy of the models)."""
    return AirlineDB.model_validate(db.model_dump())
