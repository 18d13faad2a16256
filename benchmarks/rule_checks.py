"""Does the agent check a request's rule before deciding it, is its check right, and does it decide by it?

    python benchmarks/rule_checks.py --model DIR [--hint] [--tasks 200] [--temperature T] [--threads 1] [--save FILE]
    python benchmarks/rule_checks.py --rollouts FILE [--against BASE_FILE]

Rolls the agent (or an adapter directory) out greedily (or sampling at --temperature, seeded) on the first N held-out test tasks of the
built-in airline domain — with --hint, with the domain's expert guidance in the system prompt (the
environment's `hint` option) — or reads rollouts of those tasks. For every cancellation and
compensation request (`SubTask` of kind cancel or certificate) it finds the message the agent said
after reading that reservation and classifies the request:

- checked: the message opens with "Check:"; right: the check is the teacher's word for word
  (`SubTask.check`, or `cited_check` when the agent cites values);
- done: the agent made the request's write (a `cancel_reservation` of that reservation; a
  `send_certificate` while that reservation is the last one read).

It prints, per request kind (cancel+, cancel−, certificate+, certificate−: allowed or forbidden),
checked / unchecked × done, right checks, and over every said check each condition whose answer
differs from the rule's (`silver or gold no` where the user is gold) and each cited value that is
not the record's. With --against (rollouts of the same tasks, e.g. the base agent's, saved with
--save), the paired difference in pass rate with its bootstrap interval (`evaluation.stats`, as
`tracerl eval` reports it).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from tracerl.core.io import read_jsonl, write_jsonl
from tracerl.core.trajectory import Trajectory
from tracerl.envs.airline import generate_task, task_seeds

WRITE_OF = {"cancel": "cancel_reservation", "certificate": "send_certificate"}
PART = re.compile(r"^(?P<label>.+?) (?:\((?P<value>[^)]*)\) )?(?P<answer>yes|no)$")


def check_parts(check: str) -> list[tuple[str, str | None, str]]:
    """'Check: flown (available) no, business yes.' → [('flown', 'available', 'no'), ('business', None, 'yes')]."""
    body = check.removeprefix("Check:").strip().split(".")[0]
    parts = []
    for piece in re.split(r", (?![^()]*\))", body):  # a comma inside a cited value is not a separator
        m = PART.match(piece.strip())
        if m:
            parts.append((m["label"], m["value"], m["answer"]))
    return parts


def classify(trajectory: Trajectory) -> list[dict]:
    """One row per cancellation and compensation request of the trajectory's task."""
    task = generate_task(trajectory.seed)
    said: dict[str, str] = {}  # reservation id → the first text said after reading it
    done: set[tuple[str, str]] = set()  # (write tool, reservation id)
    last_read, awaiting = None, None
    for m in trajectory.messages:
        if m.role != "assistant":
            continue
        for call in m.tool_calls or []:
            args = call.parsed_arguments() or {}
            if call.name == "get_reservation_details":
                last_read = awaiting = args.get("reservation_id")
            elif call.name == "cancel_reservation":
                done.add((call.name, args.get("reservation_id")))
            elif call.name == "send_certificate" and last_read:
                done.add((call.name, last_read))
        if not m.tool_calls and m.content and awaiting:
            said.setdefault(awaiting, m.content)
            awaiting = None
    rows = []
    for sub in task.subtasks:
        if sub.kind not in WRITE_OF:
            continue
        text = said.get(sub.reservation_id, "")
        checked = text.startswith("Check:")
        cited = checked and any(value is not None for _, value, _ in check_parts(text))
        teacher = sub.cited_check if cited else sub.check
        rows.append({"seed": trajectory.seed, "kind": sub.kind + ("+" if sub.allowed else "-"), "checked": checked,
                     "right": checked and text.startswith(teacher), "said": text.split(".")[0] if checked else "",
                     "teacher": teacher, "done": (WRITE_OF[sub.kind], sub.reservation_id) in done})
    return rows


def differences(rows: list[dict]) -> tuple[Counter, Counter]:
    """Over the said checks: answers that differ from the teacher's, by label and said answer; cited values that differ, by label."""
    answers, values = Counter(), Counter()
    for row in rows:
        if not row["checked"]:
            continue
        truth = {label: (value, answer) for label, value, answer in check_parts(row["teacher"])}
        for label, value, answer in check_parts(row["said"]):
            if label not in truth:
                continue
            true_value, true_answer = truth[label]
            if answer != true_answer:
                answers[f"{label} {answer}"] += 1
            if value is not None and value != true_value:
                values[label] += 1
    return answers, values


def summary(rows: list[dict]) -> dict:
    by_kind = {}
    for kind in ("cancel+", "cancel-", "certificate+", "certificate-"):
        rs = [r for r in rows if r["kind"] == kind]
        by_kind[kind] = {"requests": len(rs),
                         "checked": sum(r["checked"] for r in rs),
                         "checked_right": sum(r["right"] for r in rs),
                         "checked_done": sum(r["checked"] and r["done"] for r in rs),
                         "unchecked_done": sum(not r["checked"] and r["done"] for r in rs),
                         "decided_right": sum(r["done"] == kind.endswith("+") for r in rs)}
    answers, values = differences(rows)
    return {"by_kind": by_kind, "wrong_answers": dict(answers.most_common()), "wrong_cited_values": dict(values.most_common())}


def roll_out(model: str, tasks: int, hint: bool, threads: int, temperature: float = 0.0, seed: int = 0) -> list[Trajectory]:
    import torch

    from tracerl.envs.registry import make_env
    from tracerl.models.factory import make_policy
    from tracerl.envs.runner import Episode, rollout

    torch.set_num_threads(threads)
    options = {"hint": True} if hint else {}
    episodes = [Episode(seed=s, options=options) for s in task_seeds("test", tasks)]
    return rollout(lambda: make_env("airline", split="test"), make_policy(f"model:{model}", temperature=temperature, seed=seed),
                   episodes, batch_size=32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="agent or adapter directory")
    source.add_argument("--rollouts", type=Path, help="rollouts of test tasks of the airline domain (JSONL)")
    ap.add_argument("--hint", action="store_true", help="the domain's expert guidance in the system prompt")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save", type=Path, help="write the rollouts here (JSONL)")
    ap.add_argument("--against", type=Path, help="rollouts of the same tasks to take the paired difference against (JSONL)")
    args = ap.parse_args()
    if args.model:
        trajectories = roll_out(args.model, args.tasks, args.hint, args.threads, args.temperature, args.seed)
        if args.save:
            write_jsonl(args.save, trajectories)
    else:
        trajectories = read_jsonl(args.rollouts, Trajectory)
    rows = [row for t in trajectories for row in classify(t)]
    out = {"tasks": len(trajectories), "passed": sum(t.passed for t in trajectories), "hint": args.hint,
           "temperature": args.temperature, **summary(rows)}
    if args.against:
        from tracerl.evaluation.stats import paired_difference, per_task_pass_rate

        diff = paired_difference(per_task_pass_rate(trajectories), per_task_pass_rate(read_jsonl(args.against, Trajectory)))
        out["difference"] = diff.model_dump()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
