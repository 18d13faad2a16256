"""Does an agent copy ids? Per-token accuracy on the ids it must copy from the context.

    python benchmarks/agent_id_copying.py --model DIR [--rollouts test.jsonl]

1. Teacher-forced: in held-out demonstrations of the flawed airline policy (train seeds 90,000 +
   i, beyond the episodes `build-agent` trains and drills on; figures before a94b916 used
   2,100 + i, which the drills now cover), the model's greedy next-token prediction on each
   token of the user id in the first `get_user_details` call and of the opening's reservation id
   in the first `get_reservation_details` call — "k/n" per position, so a model that finds the
   first token but not the rest (or the reverse) shows it; and of the reservation id of the first
   write call, where the agent writes it in the confirmation sentence before the call and in the
   call itself.
   Then the same on the user id with words appended to the user's "My user id is …." message: a
   model that finds the id by its content is unaffected; one that copies from a fixed distance
   back is not. And, per kind of final turn, the share of held-out copy drills (`copy_drills` of
   the same demonstrations: from the request to a turn that copies a value) whose final turn the
   model predicts exactly: id reads, each other tool's calls, and said values (a new flight's
   number and date read in the search results). And per write tool and id argument
   (`teacher_forced_write_ids`), the share of those drills whose id the model predicts exactly,
   with how many of the misses go wrong on the id's first token.
2. Free generation (with --rollouts of the built-in airline domain, e.g. from
   `tracerl collect --policy model:DIR --split test`), per tool (`named_ids`): the share of the
   agent's calls whose every id is the one the conversation named for that request — the user's
   id; a reservation the user asked about (for a write, one asked about for that kind of change);
   the payment method the user asked for, for that reservation. Also the share of first
   `get_user_details` calls whose user id is exact, and of the read and of the write calls, the
   share whose every id was copied from an earlier user or tool message (`copied_ids`, which
   also counts an id copied from the wrong request). Per write tool (`write_ids`), whether its
   reservation id is one asked about for that kind of change, for another request, or for none,
   and whether its payment id is the one asked for. Of the flight-change writes (`flights_written`),
   the share whose flights were all read in a tool result, and the share that are the gold change's.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import torch

from tracerl.envs.airline import AirlineEnv
from tracerl.envs.airline.tasks import RESERVATION_ID



AIRLINE_KINDS = {t.name: t.kind for t in AirlineEnv().tools}  # the tools' kinds, for drill_kinds

def teacher_forced(model, tokenizer, demos) -> dict[str, list[str]]:
    from tracerl.models.build_agent import sft_example
    from tracerl.models.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    hits: dict[str, dict[int, list[int]]] = {"user_id": defaultdict(lambda: [0, 0]), "reservation_id": defaultdict(lambda: [0, 0])}
    for trajectory in demos:
        ids, mask = sft_example(chat, trajectory)
        opening_codes = RESERVATION_ID.findall(trajectory.messages[1].content or "")
        values = {"user_id": user_id_of(trajectory), "reservation_id": opening_codes[0] if opening_codes else None}
        for kind, value in values.items():
            if not value:
                continue
            target = tokenizer.encode(value)
            n = len(target)
            starts = [i for i in range(1, len(ids) - n + 1) if ids[i:i + n] == target and all(mask[i:i + n])]
            if not starts:
                continue
            i = starts[0]
            with torch.no_grad():
                predicted = model(torch.tensor([ids[:i + n]])).logits[0, i - 1:i + n - 1].argmax(-1).tolist()
            for k, (p, g) in enumerate(zip(predicted, target, strict=True)):
                hits[kind][k][0] += p == g
                hits[kind][k][1] += 1
    return {kind: [f"{a}/{b}" for _, (a, b) in sorted(per.items())] for kind, per in hits.items()}


def teacher_forced_write(model, tokenizer, demos) -> dict[str, dict[str, object]]:
    """Teacher-forced, the reservation id of the first write call that names one, where the agent
    writes it: in the confirmation sentence before the write ("I will cancel reservation …") and in
    the write call itself. Per token position "k/n", and the share of whole ids right."""
    from tracerl.models.build_agent import sft_example
    from tracerl.models.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    hits: dict[str, dict[int, list[int]]] = {"confirmation": defaultdict(lambda: [0, 0]), "write call": defaultdict(lambda: [0, 0])}
    whole = {kind: [0, 0] for kind in hits}
    for trajectory in demos:
        kinds = {tool.name: tool.kind for tool in trajectory.tools}
        messages = trajectory.messages
        write = next(((i, args["reservation_id"]) for i, m in enumerate(messages) if m.role == "assistant"
                      for call in (m.tool_calls or []) if kinds.get(call.function.name) == "write"
                      for args in [call.parsed_arguments() or {}] if "reservation_id" in args), None)
        if write is None:
            continue
        k, value = write
        said = [i for i in range(k) if messages[i].role == "assistant" and value in (messages[i].content or "")]
        for kind, index in (("confirmation", said[-1] if said else None), ("write call", k)):
            if index is None:
                continue
            ids, mask = sft_example(chat, trajectory.model_copy(update={"messages": messages[: index + 1]}))
            span = _last_turn_span(tokenizer, ids, mask, value)
            if span is None:
                continue
            first, last = span
            with torch.no_grad():
                predicted = model(torch.tensor([ids[:last]])).logits[0, first - 1:last - 1].argmax(-1).tolist()
            right = [p == g for p, g in zip(predicted, ids[first:last], strict=True)]
            for position, ok in enumerate(right):
                hits[kind][position][0] += ok
                hits[kind][position][1] += 1
            whole[kind][0] += all(right)
            whole[kind][1] += 1
    return {kind: {"per_token": [f"{a}/{b}" for _, (a, b) in sorted(hits[kind].items())],
                   "whole_id": f"{whole[kind][0]}/{whole[kind][1]}"} for kind in hits}


def _last_turn_span(tokenizer, ids: list[int], mask: list[int], value: str) -> tuple[int, int] | None:
    """[first, last) token positions of the last occurrence of `value` in the final assistant turn."""
    from tracerl.models.build_agent import final_turn_start

    start = final_turn_start(mask)
    ends, text = [], ""
    for position in range(start, len(ids)):
        text = tokenizer.decode(ids[start:position + 1])
        ends.append(len(text))
    at = text.rfind(value)
    if at < 0:
        return None
    first = start + next(i for i, end in enumerate(ends) if end > at)
    last = start + next(i for i, end in enumerate(ends) if end >= at + len(value)) + 1
    return first, last


def with_words_after_user_id(demos, words: str = " Thank you very much for your help today."):
    """The demonstrations with `words` appended to the user's id message (the id moves further back)."""
    from tracerl.core.messages import Message

    out = []
    for t in demos:
        messages = [Message.user(m.content + words) if m.role == "user" and "user id is " in (m.content or "") else m
                    for m in t.messages]
        out.append(t.model_copy(update={"messages": messages}))
    return out


def user_id_of(trajectory) -> str | None:
    for m in trajectory.messages:
        if m.role == "user" and m.content and "user id is " in m.content:
            return m.content.split("user id is ")[1].split(".")[0].strip()
    return None


def free_generation(trajectories) -> dict[str, float]:
    counts = defaultdict(int)
    for t in trajectories:
        uid = user_id_of(t)
        call = next((m.tool_calls[0] for m in t.messages if m.role == "assistant" and m.tool_calls
                     and m.tool_calls[0].name == "get_user_details"), None)
        if not uid or call is None:
            continue
        got = str((call.parsed_arguments() or {}).get("user_id", ""))
        counts["calls"] += 1
        counts["exact"] += got == uid
    return {"calls": counts["calls"], "exact": round(counts["exact"] / max(1, counts["calls"]), 3)}


# the kind of request each write tool serves (reads serve every request)
WRITE_KINDS = {"cancel_reservation": "cancel", "update_reservation_flights": "change",
               "update_reservation_baggages": "bags", "send_certificate": "certificate"}


def named_ids(trajectories) -> dict[str, dict[str, float | int]]:
    """Per tool (and for all reads, all writes): calls that pass an id, and the share whose every id is
    the one the conversation named for that request. Built-in airline rollouts only (the task is
    regenerated from its seed)."""
    from tracerl.envs.airline import generate_task

    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for t in trajectories:
        task = generate_task(t.seed)
        requested = {s.reservation_id: s for s in task.subtasks}
        kinds = {tool.name: tool.kind for tool in t.tools}
        for m in t.messages:
            for call in (m.tool_calls or []) if m.role == "assistant" else []:
                args = call.parsed_arguments() or {}
                ids = {k: v for k, v in args.items() if k.endswith("_id")}
                if not ids:
                    continue
                right = _named(task, requested, call.function.name, ids)
                kind = {"read": "reads", "write": "writes"}.get(kinds.get(call.function.name, ""), "unknown tools")
                for key in (call.function.name, kind):
                    counts[key][0] += 1
                    counts[key][1] += right
    return {key: {"calls": n, "named": round(ok / n, 3)} for key, (n, ok) in sorted(counts.items())}


def _named(task, requested, tool: str, ids: dict) -> bool:
    """Whether every id of a call is the one named for its request: the user's id; a requested
    reservation (of the write's kind); the payment method the user asked for on that reservation."""
    if "user_id" in ids and ids["user_id"] != task.user_id:
        return False
    if "reservation_id" not in ids:
        return True
    sub = requested.get(ids["reservation_id"])
    if sub is None or WRITE_KINDS.get(tool, sub.kind) != sub.kind:
        return False
    if "payment_id" in ids:
        return ids["payment_id"] in _asked_payments(sub)
    return True


def _asked_payments(sub) -> set:
    """The payment ids the reference writes for a request (empty for no request)."""
    return set() if sub is None else {a.arguments.get("payment_id") for a in (sub.writes or sub.anyway_writes)}


def write_ids(trajectories) -> dict[str, dict[str, int]]:
    """Per write tool, where its reservation id comes from: a reservation the user asked about for
    that kind of change (`this_request`), one asked about for another kind (`other_request`: the
    wrong request or the wrong tool), or none the user asked about (`not_requested`: a copy error);
    and of the calls that pass a payment id, how many pass the method asked for on the reservation
    (`payment_asked` of `payment_calls`). Built-in airline rollouts only."""
    from tracerl.envs.airline import generate_task

    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for t in trajectories:
        requested = {s.reservation_id: s for s in generate_task(t.seed).subtasks}
        for m in t.messages:
            for call in (m.tool_calls or []) if m.role == "assistant" else []:
                args = call.parsed_arguments() or {}
                if call.function.name not in WRITE_KINDS or "reservation_id" not in args:
                    continue
                row, sub = counts[call.function.name], requested.get(args["reservation_id"])
                row["calls"] += 1
                row["not_requested" if sub is None else
                    "this_request" if sub.kind == WRITE_KINDS[call.function.name] else "other_request"] += 1
                if "payment_id" in args:
                    row["payment_calls"] += 1
                    row["payment_asked"] += args["payment_id"] in _asked_payments(sub)
    return {tool: dict(row) for tool, row in sorted(counts.items())}


def free_generation_reservations(trajectories) -> dict:
    counts = defaultdict(int)
    for t in trajectories:
        named: set[str] = set()
        for m in t.messages:
            if m.role == "user":
                named.update(RESERVATION_ID.findall(m.content or ""))
            for call in (m.tool_calls or []) if m.role == "assistant" else []:
                value = (call.parsed_arguments() or {}).get("reservation_id")
                if value is None:
                    continue
                counts["arguments"] += 1
                counts["named by the user"] += value in named
    n = max(1, counts["arguments"])
    return {"arguments": counts["arguments"],
            "named by the user": round(counts["named by the user"] / n, 3),
            "calls whose ids were all copied": copied_ids(trajectories)}


def drills_exact_by_turn(model, tokenizer, demos) -> dict[str, dict[str, float]]:
    """Teacher-forced exactness of the demonstrations' copy drills, by what their final turn does."""
    from tracerl.models.build_agent import copy_drills, drill_kinds, exact_final_turns, sft_example
    from tracerl.models.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    groups: dict[str, list] = defaultdict(list)
    for trajectory in demos:
        drills = copy_drills(trajectory)
        for kind, d in zip(drill_kinds(drills, AIRLINE_KINDS), drills, strict=True):
            groups[kind].append(sft_example(chat, d))
    return {kind: {"drills": len(examples), "exact": round(exact_final_turns(model, examples, tokenizer.pad_token_id), 3)}
            for kind, examples in sorted(groups.items())}


@torch.no_grad()
def write_arguments_exact(model, tokenizer, demos) -> dict[str, dict[str, float]]:
    """Per write tool and id argument, teacher-forced on the demonstrations' copy drills that end in
    that write: the share whose id the model predicts exactly (every token the argmax given the true
    ones before it), and of the misses, how many go wrong on the id's first token."""
    from tracerl.models.build_agent import copy_drills, final_turn_start, sft_example
    from tracerl.models.chat import ChatFormat

    chat, counts = ChatFormat(tokenizer), defaultdict(lambda: [0, 0, 0])  # drills, exact, first token wrong
    for trajectory in demos:
        kinds = trajectory.tool_kinds()
        for drill in copy_drills(trajectory):
            calls = drill.messages[-1].tool_calls or []
            ids, mask = sft_example(chat, drill)
            start, predicted = final_turn_start(mask), None
            for call in calls:
                if kinds.get(call.function.name) != "write":
                    continue
                for name, value in call.parsed_arguments().items():
                    if not (name.endswith("_id") and isinstance(value, str)):
                        continue
                    piece = tokenizer(value, add_special_tokens=False)["input_ids"]
                    at = next(start + i for i in range(len(ids) - start) if ids[start + i:start + i + len(piece)] == piece)
                    if predicted is None:
                        predicted = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
                    right = [predicted[at + k - 1] == ids[at + k] for k in range(len(piece))]
                    count = counts[f"{call.function.name}.{name}"]
                    count[0] += 1
                    count[1] += all(right)
                    count[2] += not right[0]
    return {key: {"drills": n, "exact": round(ok / n, 3), "misses_on_first_token": first}
            for key, (n, ok, first) in sorted(counts.items())}


def copied_ids(trajectories) -> dict[str, dict[str, float]]:
    """Of the read and of the write tool calls (by the tools' kinds) that pass an id (a string argument
    named `…_id`), the share whose every id appeared verbatim in an earlier user or tool message."""
    counts = {"read": [0, 0], "write": [0, 0]}
    for t in trajectories:
        kinds = {tool.name: tool.kind for tool in t.tools}
        seen = ""
        for m in t.messages:
            if m.role in ("user", "tool"):
                seen += "\n" + (m.content or "")
            for call in (m.tool_calls or []) if m.role == "assistant" else []:
                ids = [v for k, v in (call.parsed_arguments() or {}).items() if k.endswith("_id") and isinstance(v, str)]
                kind = kinds.get(call.function.name)
                if ids and kind in counts:
                    counts[kind][0] += 1
                    counts[kind][1] += all(v in seen for v in ids)
    return {f"{kind}s": {"calls": n, "copied": round(ok / n, 3) if n else None} for kind, (n, ok) in counts.items()}


def flights_written(trajectories) -> dict[str, int | float | None]:
    """Of the flight-change writes (`update_reservation_flights`): the share whose flights were all
    read in a tool result before the call (the reservation's or a search's: not made up), and the
    share whose flights are a gold change's (the cheapest that fits: the one it had to pick)."""
    writes = read = gold = 0
    for t in trajectories:
        golds = [sorted(json.dumps(f, sort_keys=True) for f in a["arguments"].get("flights", []))
                 for a in t.info.get("gold_actions", []) if a["name"] == "update_reservation_flights"]
        seen: set[str] = set()
        for m in t.messages:
            if m.role == "tool":
                seen |= set(re.findall(r'"flight_number": "([^"]+)"', m.content or ""))
            for call in (m.tool_calls or []) if m.role == "assistant" else []:
                if call.function.name != "update_reservation_flights":
                    continue
                flights = [f for f in (call.parsed_arguments() or {}).get("flights") or [] if isinstance(f, dict)]
                writes += 1
                read += bool(flights) and all(f.get("flight_number") in seen for f in flights)
                gold += sorted(json.dumps(f, sort_keys=True) for f in flights) in golds
    share = lambda n: round(n / writes, 3) if writes else None  # noqa: E731
    return {"writes": writes, "flights_read": share(read), "gold": share(gold)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="agent directory (e.g. src/tracerl/models/tiny_agent)")
    ap.add_argument("--rollouts", type=Path, default=None, help="the agent's rollouts (tracerl collect) for the free-generation figures")
    ap.add_argument("--demos", type=int, default=40, help="held-out demonstrations for the teacher-forced figures")
    ap.add_argument("--drill-demos", type=int, default=200, help="held-out demonstrations whose copy drills are scored")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tracerl.models.build_agent import AgentRecipe, collect_demonstrations

    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    demos = collect_demonstrations(AgentRecipe(), range(90_000, 90_000 + args.demos))
    drill_demos = collect_demonstrations(AgentRecipe(), range(90_000, 90_000 + args.drill_demos))
    result = {"teacher_forced_per_token": teacher_forced(model, tokenizer, demos),
              "teacher_forced_user_id_with_words_after_it": teacher_forced(
                  model, tokenizer, with_words_after_user_id(demos))["user_id"],
              "teacher_forced_reservation_id_of_the_first_write": teacher_forced_write(model, tokenizer, demos),
              "teacher_forced_drills_exact": drills_exact_by_turn(model, tokenizer, drill_demos),
              "teacher_forced_write_ids": write_arguments_exact(model, tokenizer, drill_demos)}
    if args.rollouts:
        from tracerl.envs.loading import load_rollouts

        rollouts = load_rollouts(args.rollouts)
        result["free_generation_user_id"] = free_generation(rollouts)
        result["free_generation_reservation_id"] = free_generation_reservations(rollouts)
        result["named_ids_per_tool"] = named_ids(rollouts)
        result["write_ids"] = write_ids(rollouts)
        result["flights_written"] = flights_written(rollouts)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
