"""Labels: NA | PRESENT | LACKING per (trajectory, capability) pair, with one line of evidence.

Every labeller implements one interface:

    labeller.label(trajectories, capabilities, run_seed) -> list[dict[capability name, PairLabel]]

one dict per trajectory, in order, with an entry for every capability. A pair the labeller could
not label (an LLM reply that never parsed; a capability the rules labeller has no detector for)
has `label=None`: it is reported and left out of every count, never silently defaulted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from tracerl.contracts import Capability
from tracerl.core.errors import InputError
from tracerl.core.trajectory import Trajectory

Label = Literal["NA", "PRESENT", "LACKING"]
LABELS: tuple[Label, ...] = ("NA", "PRESENT", "LACKING")
# Codes of the label array used by aggregation.
NA, PRESENT, LACKING, UNLABELLED = 0, 1, 2, -1
CODE = {"NA": NA, "PRESENT": PRESENT, "LACKING": LACKING, None: UNLABELLED}


class PairLabel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: Label | None  # None: unlabelled (reported, excluded from counts)
    evidence: str = ""


class TrajectoryLabels(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    task_id: str
    passed: bool
    labels: dict[str, PairLabel]


class LabelRun(BaseModel):
    """One labelling run: what `DIR/labels/run_XX.json` holds."""

    model_config = ConfigDict(extra="forbid")

    run: int
    seed: int
    labeler: str
    capabilities: list[str]
    trajectories: list[TrajectoryLabels]
    unlabelled: int = 0
    problems: list[str] = []


class Labeller(Protocol):
    name: str
    deterministic: bool

    def label(self, trajectories: list[Trajectory], capabilities: list[Capability], run_seed: int) -> list[dict[str, PairLabel]]:
        """One dict per trajectory with a PairLabel for every capability."""
        ...


def make_run(
    run: int, seed: int, labeler: str, trajectories: list[Trajectory], capabilities: list[Capability],
    labels: list[dict[str, PairLabel]], problems: list[str] | None = None,
) -> LabelRun:
    names = [c.name for c in capabilities]
    rows = [
        TrajectoryLabels(index=i, task_id=t.task_id, passed=t.passed, labels={n: lab[n] for n in names})
        for i, (t, lab) in enumerate(zip(trajectories, labels, strict=True))
    ]
    unlabelled = sum(1 for row in rows for p in row.labels.values() if p.label is None)
    return LabelRun(run=run, seed=seed, labeler=labeler, capabilities=names, trajectories=rows,
                    unlabelled=unlabelled, problems=list(problems or []))


def label_codes(runs: list[LabelRun]) -> np.ndarray:
    """The int8 array [run, trajectory, capability] of label codes (NA 0, PRESENT 1, LACKING 2, unlabelled -1)."""
    if not runs:
        return np.zeros((0, 0, 0), dtype=np.int8)
    names = runs[0].capabilities
    out = np.empty((len(runs), len(runs[0].trajectories), len(names)), dtype=np.int8)
    for r, run in enumerate(runs):
        for t, row in enumerate(run.trajectories):
            for c, name in enumerate(names):
                out[r, t, c] = CODE[row.labels[name].label]
    return out


def run_path(out_dir: Path, run: int) -> Path:
    """Where the selection writes labelling run `run`: `out_dir/labels/run_XX.json`."""
    return Path(out_dir) / "labels" / f"run_{run:02d}.json"


def read_runs(out_dir: Path, n: int) -> list[LabelRun]:
    """The `n` labelling runs the selection wrote to `out_dir/labels/` (`run_path`)."""
    runs = []
    for r in range(n):
        path = run_path(out_dir, r)
        if not path.exists():
            raise InputError(f"no labelling run {r} (the selection's labels are missing)", path=path)
        try:
            runs.append(LabelRun.model_validate_json(path.read_text()))
        except ValidationError as e:
            raise InputError(f"not a labelling run: {e.errors()[0]['msg']}", path=path) from None
    return runs


def lacking(runs: list[LabelRun], names: list[str], k: int) -> dict[str, list[str]]:
    """Each failed trajectory's task id → the capabilities of `names` (in that order) that at least
    `k` of the runs labelled LACKING — TRACE's K-of-N, per trajectory."""
    if not runs:
        return {}
    counts = (label_codes(runs) == LACKING).sum(axis=0)  # [trajectory, capability]
    column = {name: c for c, name in enumerate(runs[0].capabilities)}
    return {row.task_id: [n for n in names if n in column and counts[t, column[n]] >= k]
            for t, row in enumerate(runs[0].trajectories) if not row.passed}
