"""The capability catalogue: the built-in capabilities, and users' own from YAML/JSON.

A capability (`tracerl.contracts.Capability`) has a snake_case name, a description and a labelling rubric that says what NA,
PRESENT and LACKING mean for it. Decoys are capabilities a good labeller should never select
(the agent's failures never hinge on them); they keep the selection honest.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from tracerl.contracts import Capability, Rubric
from tracerl.core.errors import InputError
from tracerl.core.config_file import parse_yaml
from tracerl.core.io import describe_validation_error, parse_json, read_text


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


def builtin_capabilities() -> list[Capability]:
    return [c.model_copy(deep=True) for c in BUILTIN]


def load_capabilities(path: str | Path) -> list[Capability]:
    """Users' capabilities from a YAML or JSON file: a list of {name, description, rubric{na,present,lacking}}
    (or a mapping with a `capabilities` list). A missing rubric gets one written from the description."""
    path = Path(path)
    text = read_text(path)
    data = parse_json(text, path) if path.suffix == ".json" else parse_yaml(text, path)
    if isinstance(data, dict) and "capabilities" in data:
        data = data["capabilities"]
    if not isinstance(data, list):
        raise InputError("expected a list of capabilities (or a mapping with a 'capabilities' list)", path=str(path))
    out = []
    for i, entry in enumerate(data):
        try:
            cap = Capability.model_validate({"source": "user", **entry} if isinstance(entry, dict) else entry)
        except ValidationError as e:
            raise InputError(f"capability {i}: {describe_validation_error(e)}", path=str(path)) from None
        out.append(cap)
    return out


def merge_capabilities(base: list[Capability], extra: list[Capability]) -> list[Capability]:
    """`base` then those of `extra` whose name is new (duplicates by name dropped, first wins)."""
    seen = {c.name for c in base}
    out = list(base)
    for c in extra:
        if c.name not in seen:
            seen.add(c.name)
            out.append(c)
    return out
