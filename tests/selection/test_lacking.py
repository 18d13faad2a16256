"""Each failed trajectory's lacking capabilities, K of N runs (what the opening gates' target openings are labelled with)."""

from __future__ import annotations

import pytest

from tracerl.core.errors import InputError
from tracerl.contracts import LabelRun, PairLabel, TrajectoryLabels, Workspace, lacking_capabilities as lacking

NAMES = ["precondition", "multi_step", "precision"]


def run(r: int, rows: list[tuple[str, bool, str]]) -> LabelRun:
    """One run; each row: task id, passed, one label letter per capability of NAMES (L, P, N, ? unlabelled)."""
    code = {"L": "LACKING", "P": "PRESENT", "N": "NA", "?": None}
    return LabelRun(run=r, seed=r, labeler="test", capabilities=NAMES, trajectories=[
        TrajectoryLabels(index=i, task_id=task, passed=passed,
                         labels={n: PairLabel(label=code[c]) for n, c in zip(NAMES, letters, strict=True)})
        for i, (task, passed, letters) in enumerate(rows)])


RUNS = [
    run(0, [("t0", False, "LLP"), ("t1", False, "PNL"), ("t2", True, "LLL"), ("t3", False, "PPP")]),
    run(1, [("t0", False, "LPP"), ("t1", False, "PN?"), ("t2", True, "LLL"), ("t3", False, "PPL")]),
    run(2, [("t0", False, "LLN"), ("t1", False, "PNL"), ("t2", True, "LLL"), ("t3", False, "PPP")]),
]


def test_a_capability_is_lacking_where_k_of_the_n_runs_say_so():
    # t0: precondition 3/3, multi_step 2/3, precision 0/3; t1: precision 2/3 (one unlabelled);
    # t2 passed (left out); t3: precision 1/3
    assert lacking(RUNS, NAMES, k=2) == {"t0": ["precondition", "multi_step"], "t1": ["precision"], "t3": []}
    assert lacking(RUNS, NAMES, k=3) == {"t0": ["precondition"], "t1": [], "t3": []}
    # in the order of the names asked for
    assert lacking(RUNS, ["precision", "multi_step", "precondition"], k=1) == {
        "t0": ["multi_step", "precondition"], "t1": ["precision"], "t3": ["precision"]}
    assert lacking([], NAMES, k=1) == {}


def test_the_runs_are_read_back_from_the_selection_folder(tmp_path):
    ws = Workspace(tmp_path)
    for r in RUNS:
        r.write(ws.label_run(r.run))
    assert [LabelRun.read(ws.label_run(r)) for r in range(3)] == RUNS
    with pytest.raises(InputError, match="run_03.json: no such file"):
        LabelRun.read(ws.label_run(3))
    ws.label_run(1).write_text('{"run": 1}')
    with pytest.raises(InputError, match="run_01.json: missing field"):
        LabelRun.read(ws.label_run(1))
