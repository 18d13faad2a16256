"""structured_data_reasoning: pick the one record that meets a criterion over the records' fields.

Task: the user lists 2 + difficulty of their records (at most 6) and asks for a write on "the one
with the highest amount" / "the lowest amount" / "the most recent" / "the oldest" (only on fields
the target's records have, where it has an observed record: the airline's created_at); from
difficulty 2 only among records with status 'active'. Only reading the records reveals the
fields. Reward: 0.2 × the fraction of listed records read + 0.8 for the exact write on the right
record and no write on any other. Success needs every record read.
"""

from __future__ import annotations

import random

from tracerl.core.messages import Action
from tracerl.envs.synthetic.templates.base import Task, TemplateEnv

CRITERIA = {  # key: (the user's words, the field compared, which end)
    "highest": ("with the highest amount", "amount", max),
    "lowest": ("with the lowest amount", "amount", min),
    "newest": ("created most recently", "created_at", max),
    "oldest": ("created first", "created_at", min),
}


class StructuredDataReasoningEnv(TemplateEnv):
    capability = "structured_data_reasoning"
    description = "Read several records and reason over their fields to find the one the user means."

    def generate(self, rng: random.Random) -> Task:
        n = min(2 + self.difficulty, 6)
        ids = self.new_ids(rng, n)
        amounts = rng.sample(range(1, 19), n)
        days = rng.sample(range(1, 15), n)
        filtered = self.difficulty >= 2
        statuses = ["active"] * n
        if filtered:  # some records are not active; at least two stay active
            for i in rng.sample(range(n), max(1, n // 3)):
                statuses[i] = rng.choice(["closed", "on hold"])
            for i in range(n):
                if statuses.count("active") < 2 and statuses[i] != "active":
                    statuses[i] = "active"
        # criteria on fields the target's records have, where it has an observed one (`shaped`)
        example = (self.target.result_examples or {}).get(self.family.check.name)
        keys = [k for k in sorted(CRITERIA) if example is None or CRITERIA[k][1] in example] or sorted(CRITERIA)
        key = rng.choice(keys)
        text, field, pick = CRITERIA[key]
        values = {"amount": [a * 50 for a in amounts], "created_at": [f"2024-05-{d:02d}" for d in days]}
        records = {record_id: self.make_record(record_id, rng, own_fields=False, status=statuses[i],
                                               **{field: values[field][i]})
                   for i, record_id in enumerate(ids)}
        pool = [r for r in records.values() if r["status"] == "active"] if filtered else list(records.values())
        chosen = pick(pool, key=lambda r: r[field])[self.id_param]
        act = self.acts[0]
        args = self.arguments(act, rng, chosen)
        details = self.render_args(args, self.id_param)
        among = " among the active ones" if filtered else ""
        want = (f"{self.phrase(act)} for the one of my {self.entity}s {', '.join(ids)} {text}{among}"
                + (f" ({details})" if details else ""))
        gold = [Action(name=self.family.check.name, arguments={self.id_param: i}) for i in ids]
        gold.append(Action(name=act.name, arguments=args))
        hint = (
            f"Look up every {self.entity} the user lists, note the field the request depends on for each, "
            "compare them, and make the change only on the one that matches."
        )
        return Task(records=records, requests=[want],
                    rules=[f"Records: change only the {self.entity} the user means."], hint=hint, gold=gold,
                    kind=f"{key}{'-active' if filtered else ''}-of-{n}", expected={"ids": ids, "gold": gold[-1]},
                    user_id=self.new_user_id(rng))

    def score(self, task: Task, calls: list[Action], attempts: list[Action]) -> tuple[float, dict[str, float]]:
        ids = task.expected["ids"]
        read = {c.arguments.get(self.id_param) for c in calls if not self.is_write(c)}
        read_share = sum(i in read for i in ids) / len(ids)
        writes = [c for c in calls if self.is_write(c)]
        right = len(writes) == 1 and self.same_call(writes[0], task.expected["gold"])
        return 0.2 * read_share + 0.8 * right, {"read": read_share, "right_record": float(right)}
