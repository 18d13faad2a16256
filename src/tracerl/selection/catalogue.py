"""The capability catalogue: the built-in capabilities, and users' own from YAML/JSON.

Two built-in sets: tool-use agents' (`BUILTIN`: customer-service targets such as τ²-bench) and code
agents' (`CODE`: SWE-bench-shaped targets, the built-in code domain, SWE-bench imports);
`catalogue_for(trajectories)` picks the set their rollouts call for.

A capability (`tracerl.contracts.Capability`) has a snake_case name, a description and a labelling rubric that says what NA,
PRESENT and LACKING mean for it. Decoys are capabilities a good labeller should never select
(the agent's failures never hinge on them); they keep the selection honest.
"""

from __future__ import annotations

from tracerl.contracts import Capability, Rubric, load_capabilities  # noqa: F401 — users' own, read here too
from tracerl.core.trajectory import Trajectory


def _cap(name: str, description: str, na: str, present: str, lacking: str, decoy: bool = False) -> Capability:
    return Capability(name=name, description=description, rubric=Rubric(na=na, present=present, lacking=lacking), decoy=decoy)


BUILTIN: tuple[Capability, ...] = (
    _cap(
        "precondition_verification",
        "Before a state-changing action, the agent reads the records it acts on and checks the policy's "
        "conditions (eligibility, time windows, class, insurance); it never takes an action the policy forbids.",
        "The task involves no decision to change state (no write action was needed or made).",
        "Every write was preceded by reading the entity it acts on and was allowed by the policy.",
        "A write the task did not call for (a forbidden action), or a write on an entity whose state the agent never read.",
    ),
    _cap(
        "multi_step_completion",
        "The agent carries a request with several sub-tasks through to the end, completing every required "
        "state change instead of stopping after the first one.",
        "The task needs fewer than two write actions.",
        "All required write actions were attempted.",
        "Some required writes were never attempted: the episode ended with sub-tasks open.",
    ),
    _cap(
        "structured_data_reasoning",
        "The agent chooses or computes values from structured records correctly: the cheapest flight that "
        "meets the constraints, the right item id, a refund or price difference.",
        "No write argument has to be chosen or computed from records.",
        "Every argument that had to be chosen or computed from records has the right value.",
        "A write's argument that must be chosen or computed from records has the wrong value.",
    ),
    _cap(
        "tool_call_precision",
        "The agent calls tools with exact names, argument names, types and ids, so that each call does what "
        "it meant to do.",
        "The task needs no tool call, or the agent made none.",
        "The calls made use the right tools with exact arguments (as the gold actions have them).",
        "A call names the right tool but its arguments differ from every matching gold action, or a call fails "
        "on invalid arguments or ids.",
    ),
    _cap(
        "error_recovery",
        "When a tool call returns an error, the agent changes course (fixes the arguments, looks the value "
        "up, tries another way) instead of repeating the failing call or giving up.",
        "No tool call returned an error.",
        "After every error the agent made a different call.",
        "The agent repeated a call identical to one that had just failed, or the episode ended on too many errors.",
    ),
    _cap(
        "information_communication",
        "The agent tells the user the facts the task requires (amounts, statuses, ids), accurately.",
        "The task requires no specific information to be communicated.",
        "Every required piece of information appears in the agent's messages.",
        "A required piece of information never appears in the agent's messages.",
    ),
    _cap(
        "tone_and_empathy",
        "The agent is polite, warm and acknowledges the user's situation.",
        "The agent wrote no text to the user.",
        "The agent's messages are polite and considerate.",
        "The agent is rude, dismissive or cold toward the user.",
        decoy=True,
    ),
    _cap(
        "language_fluency",
        "The agent writes grammatical, fluent, easy-to-read text.",
        "The agent wrote no text to the user.",
        "The agent's messages are fluent and grammatical.",
        "The agent's messages are garbled, ungrammatical or hard to read.",
        decoy=True,
    ),
)


CODE: tuple[Capability, ...] = (
    _cap(
        "fault_localization",
        "The agent finds the file and the function the issue is about — following the call the issue names to "
        "the code that runs — and changes that code, not a look-alike elsewhere.",
        "The agent edited no file, or where the fault is is unknown.",
        "Every file the agent edited is one the fix changes.",
        "The agent edited a file the fix does not touch (a copy, an unused module, the wrong function).",
    ),
    _cap(
        "test_verification",
        "After changing the code the agent runs the tests (or reproduces the issue) and reads the result before "
        "it submits, so that a wrong fix is caught and redone.",
        "The agent changed no file.",
        "The tests ran after the last change and before the submission.",
        "The agent submitted (or stopped) after a change without running the tests.",
    ),
    _cap(
        "multi_bug_completion",
        "When the issue reports several faults, the agent fixes every one of them instead of stopping after the first.",
        "The fix changes fewer than two places.",
        "Every faulty line was replaced.",
        "Some faulty lines were never replaced: the submission fixes part of the issue.",
    ),
    _cap(
        "edit_precision",
        "The agent's edit calls are exact: `old_str` copied verbatim (indentation included), valid commands and "
        "arguments, so that each edit applies.",
        "The agent made no edit call.",
        "Every edit call applied.",
        "An edit call failed (the text to replace did not appear verbatim, or the arguments were invalid).",
    ),
    *(c for c in BUILTIN if c.decoy),
)


def builtin_capabilities(code: bool = False) -> list[Capability]:
    """The built-in set: tool-use agents' (`BUILTIN`), or with `code` code agents' (`CODE`)."""
    return [c.model_copy(deep=True) for c in (CODE if code else BUILTIN)]


def catalogue_for(trajectories: list[Trajectory]) -> list[Capability]:
    """The built-in set the rollouts call for: code agents' when they are code agents' (each carries
    its submitted patch, `info["model_patch"]`), tool-use agents' otherwise."""
    return builtin_capabilities(code=bool(trajectories) and all("model_patch" in t.info for t in trajectories))


def merge_capabilities(base: list[Capability], extra: list[Capability]) -> list[Capability]:
    """`base` then those of `extra` whose name is new (duplicates by name dropped, first wins)."""
    seen = {c.name for c in base}
    out = list(base)
    for c in extra:
        if c.name not in seen:
            seen.add(c.name)
            out.append(c)
    return out
