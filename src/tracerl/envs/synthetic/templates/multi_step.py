"""multi_step_completion: the user asks for several writes; every one of them must be done.

Task: 2 + difficulty requests (at most 6), given one at a time (the agent asks for each next
one), each a write on its own record with the values the user gives; the ids are in the request.
Where the target has requests that state every value (`Target.request_examples`), they are its
users' own ("cancel reservation rowan because of my health"), each on the record it was made on,
with the target's rules in the prompt, forbidden there as often as among the target's requests:
such a request has no gold write, and the agent denies it and asks for the next one.
Reward: per request with a gold write, 0.5 for trying it (a call of its write tool on its record,
failed calls and mistyped ids included — see `names_record`; each call counts for one request)
and 0.5 for doing it exactly; averaged, and halved if any write was made that nobody asked for;
0 if a denied request was written, as the target fails a forbidden write. Success = all done
exactly, nothing else changed. The trying half is the capability itself: scored on exact writes
alone, an agent that still mistypes ids earns nothing for carrying on to the next request instead
of closing early.
"""

from __future__ import annotations

import random
from collections.abc import Collection

from tracerl.core.messages import Action
from tracerl.core.tools import ToolSchema
from tracerl.envs.synthetic.target import ToolFamily, is_flat
from tracerl.envs.synthetic.templates.base import Task, TemplateEnv


class MultiStepCompletionEnv(TemplateEnv):
    capability = "multi_step_completion"
    description = "Carry out every one of the user's several requests before finishing."

    def choose_acts(self, family: ToolFamily) -> list[ToolSchema]:
        """The writes the target's users ask for in their own words (`Target.request_examples`) when
        there are any — requests worded as on the target, not after a tool's name — else the flat ones."""
        worded = [a for a in family.acts if self.worded_requests(a, a.parameters.get("required", []))]
        flat = [a for a in family.acts if is_flat(a)] or list(family.acts)
        return (worded or flat)[:2]

    def generate(self, rng: random.Random) -> Task:
        n = min(2 + self.difficulty, 6)
        ids = self.new_ids(rng, n)
        records, gold, lines = {}, [], []
        target_words = False
        for i, record_id in enumerate(ids):
            act = rng.choice(self.acts)
            args = self.arguments(act, rng, record_id)
            # allowed and forbidden as often as among the target's requests — never all forbidden
            worded = self.worded_request(act, args, rng, True if i == n - 1 and not gold else None)
            text, fields, allowed = worded or (self.request_phrase(act, record_id, args), {}, True)
            target_words = target_words or worded is not None
            records[record_id] = self.make_record(record_id, rng, own_fields=False, **fields)
            if allowed:
                gold.append(Action(name=act.name, arguments=args))
            lines.append(text)
        hint = (
            "The user has several requests and gives them one at a time. When a request is done or denied, ask "
            "the user for the next request; close only when the user has none left."
        )
        rules = [*(self.target.rules if target_words else ()),
                 "Requests: handle every request of the user before you close."]
        kind = f"{n}-step" + (f"-{n - len(gold)}-denied" if len(gold) < n else "")
        return Task(records=records, requests=lines, rules=rules, hint=hint, gold=gold, kind=kind,
                    user_id=self.new_user_id(rng))

    def score(self, task: Task, calls: list[Action], attempts: list[Action]) -> tuple[float, dict[str, float]]:
        writes = [c for c in calls if self.is_write(c)]
        done = sum(any(self.same_call(w, g) for w in writes) for g in task.gold)
        unasked = sum(not any(self.same_call(w, g) for g in task.gold) for w in writes)
        tried = self.tried_requests(task.gold, attempts, task.records)
        denied_ids = set(task.records) - {g.arguments[self.id_param] for g in task.gold}  # records with no gold write
        denied = sum(w.arguments.get(self.id_param) in denied_ids for w in writes)
        n = len(task.gold)
        reward = 0.0 if denied else (0.5 * tried / n + 0.5 * done / n) * (0.5 if unasked else 1.0)
        return reward, {"tried": tried / n, "completed": done / n, "unrequested_writes": float(unasked),
                        "denied_writes": float(denied)}

    def tried_requests(self, gold: list[Action], attempts: list[Action], ids: Collection[str]) -> int:
        """How many requests have a write attempt of their tool on their record; calls naming a record
        are matched first, then calls naming none of the task's records `ids` (mistyped ids), each call
        to one request."""
        pending, unused = list(gold), list(attempts)
        for exact in (True, False):
            for g in list(pending):
                record_id = g.arguments[self.id_param]
                match = next((a for a in unused if a.name == g.name and (
                    a.arguments.get(self.id_param) == record_id if exact else self.names_record(a, record_id, ids))), None)
                if match is not None:
                    pending.remove(g)
                    unused.remove(match)
        return len(gold) - len(pending)
