"""Discovery: an analysis model reads a sample of failed and passed trajectories and proposes 4–10
candidate capabilities (snake_case name of 2–5 words, description, example task ids) as validated
JSON; they are merged with the catalogue, duplicates by name dropped."""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tracerl.contracts import CAPABILITY_NAME, Capability, Rubric, default_rubric
from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error
from tracerl.core.trajectory import Trajectory
from tracerl.selection.catalogue import merge_capabilities
from tracerl.models.analysis import AnalysisClient
from tracerl.selection.llm import compact_trajectory

PROMPT = """Below are transcripts of a tool-using agent: some FAILED, some PASSED.
Find the recurring capabilities whose absence explains the failures (not what the passed ones also do wrong).
Propose between 4 and 10 capabilities. Answer with one JSON object only:
{"capabilities": [{"name": "<snake_case, 2-5 words>", "description": "<2-3 sentences>",
  "example_task_ids": ["<task id>", ...],
  "rubric": {"na": "<when not needed>", "present": "<needed and exercised>", "lacking": "<needed and missing>"}}]}
"""


class Proposal(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    description: str = Field(min_length=1)
    example_task_ids: list[str] = Field(default_factory=list)
    rubric: Rubric | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not CAPABILITY_NAME.match(v) or not 2 <= len(v.split("_")) <= 5:
            raise ValueError(f"'{v}' is not a snake_case name of 2-5 words")
        return v

    @field_validator("example_task_ids", mode="before")
    @classmethod
    def _ids_as_text(cls, v: Any) -> Any:
        return [str(x) for x in v] if isinstance(v, list) else v


class Proposals(BaseModel):
    model_config = ConfigDict(extra="ignore")

    capabilities: list[Proposal] = Field(min_length=4, max_length=10)


def _validate(value: Any) -> Proposals:
    try:
        return Proposals.model_validate(value)
    except ValidationError as e:
        raise ValueError(describe_validation_error(e)) from None


def sample_for_discovery(trajectories: list[Trajectory], failed: int, passed: int, seed: int) -> list[Trajectory]:
    """Up to `failed` failed and `passed` passed trajectories, chosen with `seed`, in file order."""
    rng = random.Random(seed)
    f = [i for i, t in enumerate(trajectories) if not t.passed]
    p = [i for i, t in enumerate(trajectories) if t.passed]
    chosen = sorted(rng.sample(f, min(failed, len(f))) + rng.sample(p, min(passed, len(p))))
    return [trajectories[i] for i in chosen]


def discover(client: AnalysisClient, trajectories: list[Trajectory], *, seed: int = 0, failed: int = 8, passed: int = 4) -> list[Capability]:
    """Proposed capabilities (source "discovered"). An endpoint that never gives a valid answer
    is an InputError naming it (the run cannot do what was asked)."""
    sample = sample_for_discovery(trajectories, failed, passed, seed)
    if not sample:
        raise InputError("discovery needs at least one trajectory")
    text = "\n\n".join(compact_trajectory(t) for t in sample)
    messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": text}]
    proposals, problem = client.json_reply(messages, seed=seed, validate=_validate)
    if proposals is None:
        raise InputError(f"analysis model {client.where}: discovery failed after {client.config.max_retries + 1} "
                         f"attempts: {problem}")
    out: list[Capability] = []
    for p in proposals.capabilities:
        out = merge_capabilities(out, [Capability(
            name=p.name, description=p.description, rubric=p.rubric or default_rubric(p.description),
            source="discovered", example_task_ids=p.example_task_ids,
        )])
    return out
