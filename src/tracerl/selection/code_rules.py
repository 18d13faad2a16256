"""Rules detectors for code agents (SWE-bench-shaped trajectories), no model, deterministic.

They read what a code agent's trajectory holds: its editor calls (`str_replace_editor` with
`command` str_replace / insert / create, each with the tool's answer), its shell commands, the
submitted patch (`info["model_patch"]`) and, where the source provides them, the gold facts
(`info["gold_patch"]`, `info["gold_files"]`: the built-in code domain; a SWE-bench import has
none, and the detectors that need them say NA).

- `fault_localization`: every file the agent edited (or tried to) is a file the gold patch
  changes; LACKING when it edited a file the fix does not touch, or changed nothing in those files;
- `test_verification`: after its last change the agent ran the tests before submitting;
- `multi_bug_completion`: with two or more lines to fix, the agent's edits went at every one (an
  edit that failed counts as tried, as a failed write counts as attempted for tool-use agents);
- `edit_precision`: every edit call did what it meant to (no "No replacement was performed",
  no invalid arguments).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tracerl.core.trajectory import Trajectory

EDITOR = "str_replace_editor"
EDITS = ("str_replace", "insert", "create")
TEST_COMMAND = re.compile(r"\bpytest\b|\bunittest\b|\btox\b|runtests|\btest[\w./-]*\.py\b")
FAILED_EDIT = re.compile(r"^Error:")

Result = tuple[str, str]


@dataclass
class Edit:
    turn: int
    path: str
    command: str
    old: str
    ok: bool
    answer: str


@dataclass
class CodeAnalysis:
    edits: list[Edit] = field(default_factory=list)
    tests_at: list[int] = field(default_factory=list)  # turns of shell commands that run tests
    submit_turn: int | None = None
    changed_files: list[str] = field(default_factory=list)  # the submitted patch's files
    gold_files: list[str] | None = None
    gold_lines: list[str] = field(default_factory=list)  # the gold patch's removed lines, stripped


def is_code_trajectory(t: Trajectory) -> bool:
    """A code agent's trajectory: it carries the submitted patch (built-in code domain, SWE-bench imports)."""
    return "model_patch" in t.info


def _patch_files(patch: str) -> list[str]:
    return sorted({m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", patch or "", re.MULTILINE)})


def analyse_code(t: Trajectory) -> CodeAnalysis:
    answers = {m.tool_call_id: m.content or "" for m in t.messages if m.role == "tool"}
    a = CodeAnalysis(changed_files=_patch_files(t.info.get("model_patch", "")))
    turn = 0
    for m in t.messages:
        if m.role != "assistant":
            continue
        turn += 1
        for call in m.tool_calls or []:
            args = call.parsed_arguments() or {}
            answer = answers.get(call.id, "")
            if call.name == EDITOR and args.get("command") in EDITS:
                path = str(args.get("path", "")).removeprefix("/repo/").lstrip("/")
                a.edits.append(Edit(turn, path, str(args["command"]), str(args.get("old_str") or ""),
                                    call.id in answers and not FAILED_EDIT.match(answer), answer))
            elif call.name == EDITOR and call.parsed_arguments() is None:
                a.edits.append(Edit(turn, "", "malformed", "", False, answer))
            elif call.name == "bash" and TEST_COMMAND.search(str(args.get("command", ""))):
                a.tests_at.append(turn)
            elif call.name == "submit":
                a.submit_turn = turn
    gold = t.info.get("gold_patch")
    if gold:
        a.gold_files = list(t.info.get("gold_files") or _patch_files(gold))
        a.gold_lines = [line[1:].strip() for line in gold.splitlines() if line.startswith("-") and not line.startswith("---")]
    return a


def fault_localization(t: Trajectory) -> Result:
    a = analyse_code(t)
    if a.gold_files is None:
        return "NA", "the gold patch is unknown: where the fault is cannot be told"
    tried = sorted({e.path for e in a.edits if e.path} | set(a.changed_files))
    if not tried:
        return "NA", "the agent edited no file"
    wrong = [p for p in tried if p not in a.gold_files]
    if wrong:
        e = next((e for e in a.edits if e.path in wrong), None)
        where = f"turn {e.turn}: " if e else ""
        return "LACKING", f"{where}edited {wrong[0]}, which the fix does not touch (the fault is in {', '.join(a.gold_files)})"
    return "PRESENT", f"edited only {', '.join(tried)}, where the fault is"


def test_verification(t: Trajectory) -> Result:
    a = analyse_code(t)
    changes = [e.turn for e in a.edits if e.ok]
    if not changes:
        return "NA", "the agent changed no file"
    last = max(changes)
    end = a.submit_turn if a.submit_turn is not None else t.num_turns + 1
    if any(last < turn < end for turn in a.tests_at):
        return "PRESENT", f"ran the tests after its last edit (turn {last}) and before submitting"
    return "LACKING", f"turn {last}: edited, then {'submitted' if a.submit_turn else 'stopped'} without running the tests"


def multi_bug_completion(t: Trajectory) -> Result:
    a = analyse_code(t)
    if len(a.gold_lines) < 2:
        return "NA", "the fix changes fewer than two lines"
    tried = [line for line in a.gold_lines if any(line and line in e.old for e in a.edits)]
    if len(tried) < len(a.gold_lines):
        missing = [line for line in a.gold_lines if line not in tried]
        return "LACKING", f"edited {len(tried)} of the {len(a.gold_lines)} faulty lines; never `{missing[0]}`"
    return "PRESENT", f"edited all {len(a.gold_lines)} faulty lines (whether each edit applied is edit precision)"


def edit_precision(t: Trajectory) -> Result:
    a = analyse_code(t)
    if not a.edits:
        return "NA", "the agent made no edit call"
    failed = [e for e in a.edits if not e.ok]
    if failed:
        e = failed[0]
        return "LACKING", f"turn {e.turn}: the {e.command} on {e.path or '?'} failed: {e.answer[:90]}"
    return "PRESENT", f"{len(a.edits)} edit call{'s' if len(a.edits) != 1 else ''}, each applied"


CODE_DETECTORS = {
    "fault_localization": fault_localization,
    "test_verification": test_verification,
    "multi_bug_completion": multi_bug_completion,
    "edit_precision": edit_precision,
}
