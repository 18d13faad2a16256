"""Labels: NA | PRESENT | LACKING per (trajectory, capability) pair, with one line of evidence.

Every labeller implements one interface:

    labeller.label(trajectories, capabilities, run_seed) -> list[dict[capability name, PairLabel]]

one dict per trajectory, in order, with an entry for every capability. A pair the labeller could
not label (an LLM reply that never parsed; a capability the rules labeller has no detector for)
has `label=None`: it is reported and left out of every count, never silently defaulted.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from tracerl.contracts import (
    Capability,
    LabelRun,
    PairLabel,
    TrajectoryLabels,
)
from tracerl.core.trajectory import Trajectory

# Codes of the label array used by aggregation.
NA, PRESENT, LACKING, UNLABELLED = 0, 1, 2, -1
CODE = {"NA": NA, "PRESENT": PRESENT, "LACKING": LACKING, None: UNLABELLED}


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


