"""The LLM labeller: the analysis model (`tracerl.models.analysis`, any OpenAI-compatible endpoint).

Each trajectory is compacted (message text cut to ~300 characters, tool arguments to ~200,
failure reasons from the reward info kept) and sent with every capability's rubric; the model
answers with a JSON object of labels. Requests run concurrently (bounded), each with a timeout
and retries with exponential backoff; a reply that still does not parse marks the affected
pairs unlabelled — reported in the run's `problems`, counted in the client's `stats`, excluded
from the counts — never a crash and never a silent default. When no trajectory of a run gets a
usable answer, the run stops with one line (an `InputError`) before anything is written. Runs use
temperature > 0 and a distinct seed per run and request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tracerl.contracts import LABELS, Capability, PairLabel
from tracerl.core.trajectory import Trajectory
from tracerl.models.analysis import AnalysisClient, AnalysisConfig

TEXT_LIMIT = 300
ARGS_LIMIT = 200
PATCH_LIMIT = 600


# --- compaction ------------------------------------------------------------------------------

def _cut(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure_reasons(t: Trajectory) -> list[str]:
    """What the grader said went wrong, from the reward info the source kept."""
    reasons = []
    db = t.info.get("db_check")
    if isinstance(db, dict) and db.get("db_match") is False:
        reasons.append("final database does not match the expected one")
    for check in t.info.get("action_checks") or []:
        if isinstance(check, dict) and not check.get("action_match", True):
            action = check.get("action") or {}
            reasons.append(f"expected action not matched: {action.get('name')}({_cut(json.dumps(action.get('arguments', {})), ARGS_LIMIT)})")
    for check in t.info.get("communicate_checks") or []:
        if isinstance(check, dict) and not check.get("met", True):
            reasons.append(f"information not communicated: {_cut(check.get('info', ''), 120)}")
    for key, value in t.reward_breakdown.items():
        if value < 1.0:
            reasons.append(f"reward component {key} = {value:g}")
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):  # a code agent's tests, as SWE-bench names them
        if key in t.info and key not in t.reward_breakdown and not t.passed:
            reasons.append(f"{key} tests: {_cut(', '.join(map(str, t.info[key])), 160)}")
    return reasons


def compact_trajectory(t: Trajectory) -> str:
    """The trajectory as short text for a labelling prompt."""
    outcome = "PASSED" if t.passed else "FAILED"
    lines = [f"task {t.task_id} ({t.domain}) — {outcome}, reward {t.reward:g}, ended by {t.termination}"]
    reasons = failure_reasons(t)
    if reasons and not t.passed:
        lines.append("grader: " + "; ".join(reasons))
    turn = 0
    for m in t.messages:
        if m.role == "system":
            continue
        if m.role == "assistant":
            turn += 1
            if m.content:
                lines.append(f"[{turn}] assistant: {_cut(m.content, TEXT_LIMIT)}")
            for call in m.tool_calls or []:
                lines.append(f"[{turn}] assistant calls {call.name}({_cut(call.function.arguments, ARGS_LIMIT)})")
        elif m.role == "tool":
            lines.append(f"[{turn}] tool {m.name or ''}: {_cut(m.content or '', TEXT_LIMIT)}")
        else:
            lines.append(f"[{turn}] user: {_cut(m.content or '', TEXT_LIMIT)}")
    if "model_patch" in t.info:  # a code agent's answer
        lines.append(f"submitted patch: {_cut(t.info['model_patch'] or '(empty)', PATCH_LIMIT)}")
    return "\n".join(lines)


# --- labelling -------------------------------------------------------------------------------

SYSTEM_PROMPT = """You label transcripts of a tool-using agent: a customer-service agent acting on records, or a
coding agent fixing an issue in a repository (viewing, searching, editing files, running tests, submitting a patch).
For each capability below decide one label:
- NA: the task does not need this capability;
- PRESENT: the task needs it and the agent exercised it;
- LACKING: the task needs it and the agent did not.
When unsure between PRESENT and LACKING, choose PRESENT. Give one short evidence line per
capability naming the turn and tool call it rests on.
Answer with one JSON object only, of the form
{"labels": {"<capability name>": {"label": "NA" | "PRESENT" | "LACKING", "evidence": "<one line>"}, ...}}"""

def capability_block(capabilities: list[Capability]) -> str:
    return "\n".join(
        f"- {c.name}: {c.description}\n  NA: {c.rubric.na}\n  PRESENT: {c.rubric.present}\n  LACKING: {c.rubric.lacking}"
        for c in capabilities
    )


def parse_labels(value: Any, names: list[str]) -> dict[str, PairLabel]:
    """Validated labels from a parsed reply; raises ValueError unless every capability has one.
    The error carries the labels that were valid (`.args[1]`) so a partial reply is not lost."""
    labels = value.get("labels", value) if isinstance(value, dict) else None
    if not isinstance(labels, dict):
        raise ValueError("reply is not an object of labels")
    good: dict[str, PairLabel] = {}
    for name in names:
        entry = labels.get(name)
        if isinstance(entry, str):
            entry = {"label": entry}
        if isinstance(entry, dict) and str(entry.get("label", "")).upper() in LABELS:
            good[name] = PairLabel(label=str(entry["label"]).upper(), evidence=_cut(entry.get("evidence", ""), 200))  # type: ignore[arg-type]
    missing = [n for n in names if n not in good]
    if missing:
        raise ValueError(f"no valid label for {', '.join(missing)}", good)
    return good


class LLMLabeller:
    """Labels every trajectory with one chat request per trajectory (all capabilities at once)."""
    name = "llm"
    deterministic = False

    def __init__(self, config: AnalysisConfig, client: AnalysisClient | None = None):
        self.client = client or AnalysisClient(config)
        self.problems: list[str] = []  # of the last call to label()
        self.on_progress: Callable[[], None] | None = None  # called after each trajectory (progress bars)

    def label(self, trajectories: list[Trajectory], capabilities: list[Capability], run_seed: int) -> list[dict[str, PairLabel]]:
        names = [c.name for c in capabilities]
        system = SYSTEM_PROMPT + "\n\nCapabilities:\n" + capability_block(capabilities)

        def one(i: int) -> tuple[dict[str, PairLabel], str | None]:
            partial: dict[str, PairLabel] = {}

            def validate(value: Any) -> dict[str, PairLabel]:
                try:
                    return parse_labels(value, names)
                except ValueError as e:
                    if len(e.args) > 1 and len(e.args[1]) > len(partial):
                        partial.clear()
                        partial.update(e.args[1])
                    raise ValueError(e.args[0]) from None

            messages = [{"role": "system", "content": system}, {"role": "user", "content": compact_trajectory(trajectories[i])}]
            labels, problem = self.client.json_reply(messages, seed=run_seed * 1_000_003 + i, validate=validate)
            if self.on_progress is not None:
                self.on_progress()
            if labels is not None:
                return labels, None
            row = {n: partial.get(n) or PairLabel(label=None, evidence=f"unlabelled: {problem}") for n in names}
            return row, f"trajectory {i} (task {trajectories[i].task_id}): {problem}"

        results = self.client.map(one, len(trajectories))
        self.problems = [p for _, p in results if p]
        usable = sum(any(label.label is not None for label in row.values()) for row, _ in results)
        self.client.fail_if_nothing("labelling requests", usable, len(results))
        return [row for row, _ in results]
