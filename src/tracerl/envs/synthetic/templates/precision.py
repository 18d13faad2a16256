"""tool_call_precision: fill every parameter of a many-parameter write call exactly.

Task: the target's flat write tool with the most parameters; the user gives every value
(1 call at difficulty 0–1, 2 at 2–3, 3 at 4). From difficulty 1 the user also mentions an
outdated value for one parameter, which must not be used. Reward: for each requested call, the
share of its parameters right in the last write of that tool on that record; averaged. Success
= every value exact.

Where the target has its users' own requests for that write (`Target.request_examples`, the ones
its rules allowed), half the tasks are one of them instead (kind "target-1-call"): the user's
words, the record and user fields it was made on, the target's rules in the prompt, and the write
the target's rules make of them — on the built-in airline a bag request, whose total and paid bag
counts the agent computes from the reservation (cabin, passengers, bags it has) and the user's
membership: the values the target's agent mis-picks, scored value by value.
"""

from __future__ import annotations

import json
import random
from functools import cached_property

from tracerl.core.messages import Action, canonical_json
from tracerl.core.tools import ToolSchema
from tracerl.envs.prompts import rule_hint
from tracerl.envs.synthetic.target import ToolFamily, argument_complexity, is_flat
from tracerl.envs.synthetic.templates.base import TARGET_WORDED_SHARE, Task, TemplateEnv


class ToolCallPrecisionEnv(TemplateEnv):
    capability = "tool_call_precision"
    description = "Write tool calls whose every argument is exactly what the user gave."

    def choose_acts(self, family: ToolFamily) -> list[ToolSchema]:
        flat = [a for a in family.acts if is_flat(a)] or list(family.acts)
        return [max(flat, key=lambda a: (argument_complexity(a), a.name))]

    @cached_property
    def target_requests(self) -> list[dict]:
        """The target users' requests for the write that its rules allowed (`askable_requests`)."""
        return [e for e in self.askable_requests(self.acts[0]) if e["allowed"]]

    def target_task(self, rng: random.Random) -> Task:
        """One of the target users' requests for the write, the target's rules in the prompt."""
        act = self.acts[0]
        (record_id,) = self.new_ids(rng, 1)
        user_id = self.new_user_id(rng)
        asked = self.ask_target_request(act, rng.choice(self.target_requests), rng, record_id, user_id)
        record = self.make_record(record_id, rng, own_fields=False, **asked.fields)
        return Task(records={record_id: record}, requests=[asked.text], rules=list(self.target.rules),
                    hint=rule_hint(self.entity, self.family.check.name),
                    gold=[Action(name=act.name, arguments=asked.arguments)], kind="target-1-call",
                    user_id=user_id, user_fields=asked.user, questions=[asked.questions])

    def generate(self, rng: random.Random) -> Task:
        if self.target_requests and rng.random() < TARGET_WORDED_SHARE:
            return self.target_task(rng)
        act = self.acts[0]
        n = 1 + self.difficulty // 2
        ids = self.new_ids(rng, n)
        records, gold, lines = {}, [], []
        for record_id in ids:
            records[record_id] = self.make_record(record_id, rng)
            args = self.arguments(act, rng, record_id)
            gold.append(Action(name=act.name, arguments=args))
            line = self.request_phrase(act, record_id, args)
            others = [k for k in args if k != self.id_param]
            if self.difficulty >= 1 and others:
                name = rng.choice(others)
                old = self.arguments(act, rng, record_id)[name]
                if canonical_json(old) != canonical_json(args[name]):
                    line += f", not my old {name.replace('_', ' ')} {json.dumps(old, ensure_ascii=False)}"
            lines.append(line)
        hint = (
            "Copy every value exactly as the user wrote it — same spelling, case, symbols and list order — into "
            "the parameter with the matching name, and ignore values the user calls outdated."
        )
        return Task(records=records, requests=lines,
                    rules=["Values: use exactly the values the user gives."], hint=hint, gold=gold, kind=f"{n}-call",
                    user_id=self.new_user_id(rng))

    def score(self, task: Task, calls: list[Action], attempts: list[Action]) -> tuple[float, dict[str, float]]:
        shares = []
        for g in task.gold:
            mine = [c for c in calls if c.name == g.name and c.arguments.get(self.id_param) == g.arguments[self.id_param]]
            if not mine:
                shares.append(0.0)
                continue
            last = mine[-1].arguments
            shares.append(sum(canonical_json(last.get(k)) == canonical_json(v) for k, v in g.arguments.items())
                          / len(g.arguments))
        exact = sum(s == 1.0 for s in shares) / len(shares)
        return sum(shares) / len(shares), {"argument_accuracy": sum(shares) / len(shares), "exact_calls": exact}
