"""The rules labeller: programmatic detectors, no model, no network, deterministic.

It reads a trajectory's tool calls and results, the tools' kinds (read / write / generic) and,
where the source provides them, `info["gold_actions"]`, `info["communicate_info"]` and (built-in
domains) `info["reasoning_args"]` — [gold action index, argument name] pairs whose value must be
chosen or computed from records.

Write calls are matched one-to-one to the gold write actions: first exact matches (same name,
equal arguments), then by name alone. A name match with different arguments is a
structured-data-reasoning error where the differing arguments are reasoning arguments of that
gold action, and a tool-call-precision error for every other differing argument (so with no
`reasoning_args`, as in τ²-bench files, any difference is a precision error). An unmatched gold
write is a sub-task never attempted; an unmatched write call is one the task did not call for.

The run seed is ignored: the same trajectories give the same labels in every run, so K-of-N is
met trivially.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.contracts import Capability, PairLabel
from tracerl.core.messages import Action
from tracerl.core.trajectory import Trajectory
from tracerl.selection.catalogue import builtin_capabilities
from tracerl.selection.code_rules import CODE_DETECTORS

# Errors that mean the call itself was wrong (arguments, ids, names), not that the policy forbade it.
INVALID_CALL_ERROR = re.compile(
    r"invalid|not valid|not found|unknown|does not exist|no such|missing|must be|malformed|not a valid|wrong type",
    re.IGNORECASE,
)


@dataclass
class Call:
    """One tool call the agent made, with its result."""

    turn: int  # 1-based assistant turn
    name: str
    args: dict[str, Any] | None  # None: arguments were not a JSON object
    kind: str
    result: str | None = None
    error: bool = False

    def show(self, limit: int = 120) -> str:
        args = "<malformed>" if self.args is None else json.dumps(self.args, sort_keys=True, ensure_ascii=False)
        text = f"{self.name}({args})"
        return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Analysis:
    """What every detector needs, computed once per trajectory."""

    trajectory: Trajectory
    calls: list[Call]
    kinds: dict[str, str]
    gold: list[Action] | None
    gold_writes: list[int]  # indices into gold
    matches: dict[int, int] = field(default_factory=dict)  # write call index (in calls) → gold index
    unmatched_gold: list[int] = field(default_factory=list)
    extra_writes: list[int] = field(default_factory=list)  # call indices of writes matching no gold write
    reasoning: dict[int, set[str]] = field(default_factory=dict)  # gold index → reasoning argument names
    texts: list[tuple[int, str]] = field(default_factory=list)  # (turn, assistant text)


def analyse(t: Trajectory) -> Analysis:
    kinds = t.tool_kinds()
    results = {m.tool_call_id: m for m in t.messages if m.role == "tool"}
    calls: list[Call] = []
    texts: list[tuple[int, str]] = []
    turn = 0
    for m in t.messages:
        if m.role != "assistant":
            continue
        turn += 1
        if m.content:
            texts.append((turn, m.content))
        for tc in m.tool_calls or []:
            res = results.get(tc.id)
            calls.append(Call(turn, tc.name, tc.parsed_arguments(), kinds.get(tc.name, "generic"),
                              res.content if res else None, bool(res and res.is_error)))
    gold = t.gold_actions()
    gold_writes = [i for i, a in enumerate(gold or []) if kinds.get(a.name) == "write"]
    a = Analysis(t, calls, kinds, gold, gold_writes, texts=texts)
    for pair in t.info.get("reasoning_args") or []:
        a.reasoning.setdefault(int(pair[0]), set()).add(str(pair[1]))
    if gold is not None:
        _match_writes(a)
    return a


def _match_writes(a: Analysis) -> None:
    assert a.gold is not None
    writes = [i for i, c in enumerate(a.calls) if c.kind == "write"]
    open_gold = list(a.gold_writes)
    free = list(writes)
    for i in writes:  # exact matches first
        for g in open_gold:
            if a.calls[i].name == a.gold[g].name and a.calls[i].args == a.gold[g].arguments:
                a.matches[i] = g
                open_gold.remove(g)
                free.remove(i)
                break
    entity_params = _entity_params(a)
    for g in list(open_gold):  # then by name: the free call of that tool differing in the fewest arguments
        same = [i for i in free if a.calls[i].name == a.gold[g].name and _same_entity(a, i, a.gold[g].arguments, entity_params)]
        if not same:
            continue
        best = min(same, key=lambda i: (len(_differing(a.calls[i].args, a.gold[g].arguments)), i))
        a.matches[best] = g
        open_gold.remove(g)
        free.remove(best)
    a.unmatched_gold = open_gold
    a.extra_writes = free


def _same_entity(a: Analysis, i: int, gold: dict[str, Any], entity_params: set[str]) -> bool:
    """Whether write call i acts on gold's entity: its entity ids agree with gold's, or the call
    failed as invalid (a mistyped id names no entity; a real other entity is another action)."""
    call = a.calls[i]
    differs = any((call.args or {}).get(p) != gold[p] for p in entity_params & set(gold))
    return not differs or (call.error and bool(INVALID_CALL_ERROR.search(call.result or "")))


def _differing(args: dict[str, Any] | None, gold: dict[str, Any]) -> set[str]:
    if args is None:
        return set(gold) | {"<arguments>"}
    return {k for k in set(args) | set(gold) if args.get(k, _MISSING) != gold.get(k, _MISSING)}


_MISSING = object()


def _same_shape(value: Any, gold: Any) -> bool:
    """Whether `value` has gold's JSON type and structure (a different pick, not a malformed one)."""
    if isinstance(gold, bool) or isinstance(value, bool):
        return isinstance(gold, bool) and isinstance(value, bool)
    if isinstance(gold, (int, float)):
        return isinstance(value, (int, float))
    if isinstance(gold, dict):
        return isinstance(value, dict) and set(value) == set(gold) and all(_same_shape(value[k], gold[k]) for k in gold)
    if isinstance(gold, list):
        return isinstance(value, list) and (not gold or all(_same_shape(v, gold[0]) for v in value))
    return type(value) is type(gold)


def split_differences(a: Analysis, i: int, g: int) -> tuple[set[str], set[str]]:
    """The arguments in which write call i differs from gold action g, split into (reasoning errors,
    precision errors). A reasoning argument counts as a reasoning error only when the value is
    well-formed (gold's type and shape) and the call did not fail as invalid; otherwise it is a
    precision error (a typo or a wrong type, not a wrong choice)."""
    call = a.calls[i]
    gold = a.gold[g].arguments  # type: ignore[index]
    differing = _differing(call.args, gold)
    reasoning = a.reasoning.get(g, set())
    invalid = call.error and bool(INVALID_CALL_ERROR.search(call.result or ""))
    choice = {k for k in differing & reasoning if call.args is not None and k in call.args and k in gold
              and _same_shape(call.args[k], gold[k]) and not (invalid and _mentions(call.result or "", call.args[k]))}
    return choice, differing - choice


def _mentions(text: str, value: Any) -> bool:
    """Whether an error text names one of the scalar values inside `value`."""
    if isinstance(value, dict):
        return any(_mentions(text, v) for v in value.values())
    if isinstance(value, list):
        return any(_mentions(text, v) for v in value)
    return re.search(rf"(?<![\w.]){re.escape(str(value))}(?![\w])", text) is not None


def _exactly_gold(a: Analysis, call: Call) -> bool:
    return any(call.name == g.name and call.args == g.arguments for g in a.gold or [])


def _entity_params(a: Analysis) -> set[str]:
    """Argument names that identify an entity the agent can read: parameters of the read tools
    (from their schemas and from the read calls actually made) that end in `_id`."""
    names = set()
    for tool in a.trajectory.tools:
        if tool.kind == "read":
            names |= set(tool.parameters.get("properties", {}))
    for c in a.calls:
        if c.kind == "read" and c.args:
            names |= set(c.args)
    return {n for n in names if n.endswith("_id")}


# --- detectors: each returns (label, evidence) ------------------------------------------------

Result = tuple[str, str]


def tool_call_precision(a: Analysis) -> Result:
    if not a.calls:
        return "NA", "no tool call was made"
    problems = []
    for i, g in a.matches.items():
        call = a.calls[i]
        wrong = split_differences(a, i, g)[1]
        if wrong:
            problems.append(f"turn {call.turn}: {call.show()} differs from the gold {call.name} in {', '.join(sorted(wrong))}")
    for call in a.calls:
        if call.error and INVALID_CALL_ERROR.search(call.result or "") and not _exactly_gold(a, call):
            problems.append(f"turn {call.turn}: {call.show()} failed: {(call.result or '')[:80]}")
        elif call.args is None:
            problems.append(f"turn {call.turn}: {call.name} called with arguments that are not a JSON object")
        elif a.kinds and call.name not in a.kinds:
            problems.append(f"turn {call.turn}: unknown tool '{call.name}'")
    if problems:
        return "LACKING", _first(problems)
    return "PRESENT", f"{len(a.calls)} tool calls, all with exact arguments"


def multi_step_completion(a: Analysis) -> Result:
    if a.gold is None:
        return "NA", "no gold actions: the required writes are unknown"
    n = len(a.gold_writes)
    steps = max(n, len(a.trajectory.info.get("subtasks") or []))
    if steps < 2:
        return "NA", f"the task needs {n} write action{'s' if n != 1 else ''}"
    if n == 0:
        return "NA", "none of the task's requests needs a write"
    if a.unmatched_gold:
        missing = ", ".join(a.gold[g].name for g in a.unmatched_gold)  # type: ignore[index]
        return "LACKING", f"attempted {n - len(a.unmatched_gold)} of {n} required writes; never attempted: {missing}"
    return "PRESENT", f"all {n} required writes attempted"


def precondition_verification(a: Analysis) -> Result:
    writes = [i for i, c in enumerate(a.calls) if c.kind == "write"]
    if not writes:
        return "NA", "no write action was made"
    entity_params = _entity_params(a)
    for i in writes:
        call = a.calls[i]
        invalid = call.error and INVALID_CALL_ERROR.search(call.result or "")
        if a.gold is not None and i in a.extra_writes and not invalid:
            return "LACKING", f"turn {call.turn}: {call.show()} is a write the task did not call for"
        # the entity it acts on: the gold action's ids when matched (a typo is precision, not this)
        target = a.gold[a.matches[i]].arguments if (a.gold is not None and i in a.matches) else (call.args or {})
        for param in sorted(entity_params & set(target)):
            value = target[param]
            if isinstance(value, (str, int)) and not _read_before(a, i, value):
                return "LACKING", f"turn {call.turn}: {call.name} on {param}={value} without reading it first"
    return "PRESENT", f"{len(writes)} write{'s' if len(writes) != 1 else ''}, each allowed and preceded by a read of its entity"


def _read_before(a: Analysis, index: int, value: Any) -> bool:
    return any(c.kind == "read" and not c.error and c.args and value in c.args.values() for c in a.calls[:index])


def structured_data_reasoning(a: Analysis) -> Result:
    numeric = [x for x in _required_info(a) if _NUMBER.fullmatch(_normal(x))]
    if (a.gold is None or not a.reasoning) and not numeric:
        return "NA", "no value has to be chosen or computed from records"
    checked = 0
    for i, g in a.matches.items():
        wrong = split_differences(a, i, g)[0]
        if wrong:
            call = a.calls[i]
            name = sorted(wrong)[0]
            got = (call.args or {}).get(name)
            return "LACKING", f"turn {call.turn}: {call.name} {name}={got!r}, the records give {a.gold[g].arguments.get(name)!r}"  # type: ignore[index]
        checked += g in a.reasoning
    told = _amounts_told(a)
    required = Counter(map(_normal, numeric))
    wrong_amounts = sorted((told - required).elements())
    missing = sorted((required - told).elements())
    if wrong_amounts and missing:
        return "LACKING", f"told the user {', '.join(wrong_amounts[:2])} where the records give {', '.join(missing[:2])}"
    checked += sum(_normal(x) in _said(a) for x in numeric)
    if not checked:
        return "NA", "no value chosen or computed from records was used"
    return "PRESENT", f"{checked} value{'s' if checked != 1 else ''} chosen or computed from records, all right"


def error_recovery(a: Analysis) -> Result:
    failed = [c for c in a.calls if c.error]
    if not failed and a.trajectory.termination != "too_many_errors":
        return "NA", "no tool call returned an error"
    if a.trajectory.termination == "too_many_errors":
        return "LACKING", "the episode ended on too many errors"
    for j, c in enumerate(a.calls):
        if c.error and any(d.name == c.name and d.args == c.args for d in a.calls[j + 1 :]):
            return "LACKING", f"turn {c.turn}: {c.show()} failed and was repeated unchanged"
    return "PRESENT", f"{len(failed)} error{'s' if len(failed) != 1 else ''}, each followed by a different call"


def information_communication(a: Analysis) -> Result:
    required = _required_info(a)
    if not required:
        return "NA", "no information had to be communicated"
    said = _said(a)
    missing = [x for x in required if _normal(x) not in said]
    if not missing:
        return "PRESENT", f"communicated all {len(required)} required item{'s' if len(required) != 1 else ''}"
    if a.unmatched_gold:  # the missing items belong to requests never carried out: multi-step completion
        return "PRESENT", f"items not told ({', '.join(missing[:3])}) belong to requests never carried out"
    numeric_missing = [x for x in missing if _NUMBER.fullmatch(_normal(x))]
    if len(numeric_missing) == len(missing) and _amounts_told(a) and structured_data_reasoning(a)[0] == "LACKING":
        return "PRESENT", "the agent told the amounts, with values wrongly chosen or computed (structured data reasoning)"
    return "LACKING", f"never told the user: {', '.join(missing[:3])}"


_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_AMOUNT = re.compile(r"\$\s?(\d+(?:\.\d+)?)|(?<![\w.])(\d+(?:\.\d+)?)\s*(?:dollars|usd)\b", re.IGNORECASE)


def _required_info(a: Analysis) -> list[str]:
    return [str(x) for x in a.trajectory.info.get("communicate_info") or []]


def _said(a: Analysis) -> str:
    return _normal(" ".join(text for _, text in a.texts))


def _amounts_told(a: Analysis) -> Counter[str]:
    """Money amounts ("$12.50", "40 dollars") the agent stated when confirming a write the task
    called for (its messages between the previous write call and that write), counted once per write."""
    write_turns = [c.turn for c in a.calls if c.kind == "write"]
    out: Counter[str] = Counter()
    for w in sorted(a.calls[i].turn for i in a.matches):
        start = max((t for t in write_turns if t < w), default=0)
        amounts: set[str] = set()
        for turn, text in a.texts:
            if start < turn < w:
                amounts |= {m.group(1) or m.group(2) for m in _AMOUNT.finditer(_normal(text))}
        out.update(amounts)
    return out


def _normal(text: str) -> str:
    return re.sub(r"(?<=\d),(?=\d{3})", "", str(text)).lower().strip()


def _writes_text(a: Analysis) -> Result:
    """Decoys: the rules see nothing that could make them LACKING."""
    if not a.texts:
        return "NA", "the agent wrote no text to the user"
    return "PRESENT", f"no rule finds a lack in the agent's {len(a.texts)} message{'s' if len(a.texts) != 1 else ''}"


def _first(problems: list[str]) -> str:
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


DETECTORS: dict[str, Callable[[Analysis], Result]] = {
    "precondition_verification": precondition_verification,
    "multi_step_completion": multi_step_completion,
    "structured_data_reasoning": structured_data_reasoning,
    "tool_call_precision": tool_call_precision,
    "error_recovery": error_recovery,
    "information_communication": information_communication,
    "tone_and_empathy": _writes_text,
    "language_fluency": _writes_text,
    # code agents' (tracerl.selection.code_rules): they read the trajectory, not this module's Analysis
    **{name: (lambda a, detect=detect: detect(a.trajectory)) for name, detect in CODE_DETECTORS.items()},
}


class RulesLabeller:
    """Deterministic labeller over the DETECTORS; capabilities without a detector stay unlabelled."""

    name = "rules"
    deterministic = True

    def label(self, trajectories: list[Trajectory], capabilities: list[Capability], run_seed: int = 0) -> list[dict[str, PairLabel]]:
        out = []
        for t in trajectories:
            a = analyse(t)
            row = {}
            for cap in capabilities:
                detector = DETECTORS.get(cap.name)
                if detector is None:
                    row[cap.name] = PairLabel(label=None, evidence="the rules labeller has no detector for this capability (use --labeler llm)")
                else:
                    label, evidence = detector(a)
                    row[cap.name] = PairLabel(label=label, evidence=evidence)  # type: ignore[arg-type]
            out.append(row)
        return out


def failures_by_capability(trajectories: Sequence[Trajectory], capabilities: Sequence[str]) -> dict[str, int]:
    """How many failed trajectories the rules labeller marks LACKING for each capability."""
    known = {c.name: c for c in builtin_capabilities() + builtin_capabilities(code=True)}
    caps = [known[name] for name in capabilities if name in known]
    failed = [t for t in trajectories if not t.passed]
    counts: Counter[str] = Counter({c.name: 0 for c in caps})
    if failed and caps:
        for labels in RulesLabeller().label(failed, caps, 0):
            for name, label in labels.items():
                counts[name] += int(label.label == "LACKING")
    return dict(counts)
