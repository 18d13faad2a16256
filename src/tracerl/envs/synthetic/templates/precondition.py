"""precondition_verification: acting is right in some seeds and forbidden in others; only a read
of the record reveals which.

Task: the user asks for one write (two from difficulty 3) on a record. The policy lists the
conditions under which the write is allowed (1 condition at difficulty 0, up to 3). Each
requested record passes them with probability ½. Reward per request, averaged over requests:
0.3 for reading the record before any write on it; 0.4 for the right decision — trying the write
when it is allowed, trying none when it is forbidden; 0.3 for the outcome — the exact write done
when allowed, none when forbidden. Success needs all three on every request.

Where the target has its users' own requests for the write, both ones its rules allowed and ones
they forbade (`Target.request_examples`), half the tasks are one of them instead (kind
"target-allowed" / "target-forbidden"): the user's words, the record it was made on, the target's
rules in the prompt, allowed or forbidden with probability ½ each — the decision the agent meets
on the target, on the target's own fields (booking time, cabin, insurance and the stated reason on
the built-in airline). The other half keeps the template's own conditions: a decision a small
agent learns in a few hundred rollouts, where the target's alone it did not learn in 3,200
(measured 2026-12-04 at 5a0a75d with the agent shipped then).

Decisions are read from every write call the agent made, the failed ones too. A failed write
counts as trying it on a record when it named that record or none of the task's records (a
mistyped id): the agent tried to do what the policy forbids, and only its typo kept the database
unchanged. Scored on successful calls alone, an agent that mistypes ids passes the forbidden half
by accident, and copying the id right costs it reward there. And without the decision's own
share, refusing an allowed request scores what a mistyped write does, so an agent that cannot yet
copy ids learns to refuse everything (measured: after 24 GRPO steps it refused every allowed
request whose record it read).
"""

from __future__ import annotations

import random
from functools import cached_property
from typing import Any

from tracerl.core.messages import Action
from tracerl.core.tools import ToolSchema
from tracerl.envs.prompts import rule_hint
from tracerl.envs.synthetic.target import ToolFamily
from tracerl.envs.synthetic.templates.base import TARGET_WORDED_SHARE, Task, TemplateEnv

AMOUNT_LIMIT = 500


class PreconditionVerificationEnv(TemplateEnv):
    capability = "precondition_verification"
    description = "Check the record with a read tool and act only when the policy's conditions hold."

    def choose_acts(self, family: ToolFamily) -> list[ToolSchema]:
        """The first write the target's users ask for in their own words, allowed and forbidden, else
        the simplest write."""
        return [next((act for act in family.acts if self.both_decisions_worded(act)), family.acts[0])]

    def both_decisions_worded(self, act: ToolSchema) -> bool:
        """Whether the target has its users' requests for `act`, allowed ones and forbidden ones."""
        return {e["allowed"] for e in self.worded_requests(act, act.parameters.get("required", []))} == {True, False}

    @cached_property
    def has_target_requests(self) -> bool:
        """Whether half the tasks are the target's own requests (see `choose_acts`)."""
        return self.both_decisions_worded(self.acts[0])

    def conditions(self) -> list[str]:
        return ["status", "amount", "flagged"][: min(1 + self.difficulty, 3)]

    def rules(self, act: str) -> list[str]:
        """One rule line in the target's style: "Cancel reservation: allowed only if …"."""
        text = {
            "status": "its status is 'active'",
            "amount": f"its amount is at most {AMOUNT_LIMIT}",
            "flagged": "it is not flagged",
        }
        parts = [text[c] for c in self.conditions()]
        condition = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        label = act.replace("_", " ").capitalize()
        return [f"{label}: allowed only if {condition}. Otherwise make no change: say you cannot, and why."]

    def condition_fields(self, rng: random.Random, ok: bool) -> dict[str, Any]:
        """A record's fields under the template's own conditions: all hold when `ok`, else one fails."""
        fields: dict[str, Any] = {"amount": rng.randint(1, AMOUNT_LIMIT // 50) * 50}
        if not ok:
            broken = rng.choice(self.conditions())
            if broken == "status":
                fields["status"] = rng.choice(["closed", "on hold"])
            elif broken == "amount":
                fields["amount"] = rng.randint(AMOUNT_LIMIT // 50 + 1, 20) * 50
            else:
                fields["flagged"] = True
        # conditions not in force at this difficulty vary freely: they must not matter
        if "amount" not in self.conditions() and rng.random() < 0.5:
            fields["amount"] = rng.randint(AMOUNT_LIMIT // 50 + 1, 20) * 50
        if "flagged" not in self.conditions():
            fields["flagged"] = rng.random() < 0.3
        return fields

    def generate(self, rng: random.Random) -> Task:
        act = self.acts[0]
        n = 2 if self.difficulty >= 3 else 1
        ids = self.new_ids(rng, n)
        records, gold, requests, allowed = {}, [], [], {}
        worded = self.has_target_requests and rng.random() < TARGET_WORDED_SHARE
        for record_id in ids:
            ok = rng.random() < 0.5
            if worded:
                args = self.arguments(act, rng, record_id)
                text, fields, ok = self.worded_request(act, args, rng, ok)
                records[record_id] = self.make_record(record_id, rng, own_fields=False, **fields)
            else:
                records[record_id] = self.make_record(record_id, rng, **self.condition_fields(rng, ok))
                args = self.arguments(act, rng, record_id)
                text = self.request_phrase(act, record_id, args)
            gold.append(Action(name=self.family.check.name, arguments={self.id_param: record_id}))
            if ok:
                gold.append(Action(name=act.name, arguments=args))
            allowed[record_id] = args if ok else None
            requests.append(text)
        hint = rule_hint(self.entity, self.family.check.name) if worded else (
            f"Before changing a {self.entity}, look it up with {self.family.check.name} and compare it with every "
            "condition in the policy. Act only if all of them hold; otherwise make no change and tell the user "
            "which condition fails."
        )
        kind = ("target-" if worded else "") + "+".join("allowed" if allowed[i] else "forbidden" for i in ids)
        rules = list(self.target.rules) if worded else self.rules(act.name)
        return Task(records=records, requests=requests, rules=rules, hint=hint,
                    gold=gold, kind=kind, expected={"allowed": allowed, "act": act.name},
                    user_id=self.new_user_id(rng))

    def score(self, task: Task, calls: list[Action], attempts: list[Action]) -> tuple[float, dict[str, float]]:
        allowed: dict[str, dict[str, Any] | None] = task.expected["allowed"]
        checked = decided = done = 0.0
        for record_id, args in allowed.items():
            writes = self.on_record(calls, record_id, write=True)
            reads = self.on_record(calls, record_id, write=False)
            checked += bool(reads) and (not writes or reads[0][0] < writes[0][0])
            tried = any(self.names_record(a, record_id, allowed) for a in attempts)
            if args is None:
                decided += not tried
                done += not tried
            else:
                gold = Action(name=task.expected["act"], arguments=args)
                decided += tried
                done += len(writes) == 1 and self.same_call(writes[0][1], gold)
        n = len(allowed)
        checked, decided, done = checked / n, decided / n, done / n
        return 0.3 * checked + 0.4 * decided + 0.3 * done, {"checked": checked, "decision": decided, "outcome": done}
