"""multi_step_completion: the user asks for several writes; every one of them must be done.

Task: 2 + difficulty requests (at most 6), each a write on its own record with the values the
user gives; the ids are in the request, so no read is needed. Reward: the fraction of requested
writes done exactly, halved if any write was made that nobody asked for. Success = all done,
nothing else changed.
"""

from __future__ import annotations

import random

from tracerl.core.messages import Action
from tracerl.core.tools import ToolSchema
from tracerl.synthesis.target import ToolFamily, is_flat
from tracerl.synthesis.templates.base import Task, TemplateEnv


class MultiStepCompletionEnv(TemplateEnv):
    capability = "multi_step_completion"
    description = "Carry out every one of the user's several requests before finishing."

    def choose_acts(self, family: ToolFamily) -> list[ToolSchema]:
        flat = [a for a in family.acts if is_flat(a)] or list(family.acts)
        return flat[:2]

    def generate(self, rng: random.Random) -> Task:
        n = min(2 + self.difficulty, 6)
        ids = self.new_ids(rng, n)
        records, gold, lines = {}, [], []
        for record_id in ids:
            records[record_id] = self.make_record(record_id, rng)
            act = rng.choice(self.acts)
            args = self.arguments(act, rng, record_id)
            gold.append(Action(name=act.name, arguments=args))
            lines.append(self.request_phrase(act, record_id, args))
        request, restate = self.opening(lines)
        hint = (
            "The user has several requests. Keep a checklist: after each tool call, see which requests are "
            "still open and handle the next one. Reply to the user only when every request is done."
        )
        return Task(records=records, request=request, restate=restate,
                    rules=["Requests: handle every request of the user before you close."], hint=hint, gold=gold,
                    kind=f"{n}-step", user_id=self.new_user_id(rng), n_requests=n)

    def score(self, task: Task, calls: list[Action], attempts: list[Action]) -> tuple[float, dict[str, float]]:
        writes = [c for c in calls if self.is_write(c)]
        done = sum(any(self.same_call(w, g) for w in writes) for g in task.gold)
        unasked = sum(not any(self.same_call(w, g) for g in task.gold) for w in writes)
        completed = done / len(task.gold)
        reward = completed * (0.5 if unasked else 1.0)
        return reward, {"completed": completed, "unrequested_writes": float(unasked)}
