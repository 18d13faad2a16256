"""Done-when: on the built-in airline domain's flawed-policy rollouts (`tracerl collect`), `select --labeler rules`
selects exactly the planted capabilities whose coverage reaches ρ, and never a decoy.

The flawed policy records the faults it planted in `info["faults"]` (ground truth the labeller
never reads); each fault maps to one capability. Ground-truth coverage = failed trajectories with
that fault planted / failed trajectories.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracerl.cli import main
from tracerl.envs.loading import load_rollouts

FAULT_CAPABILITY = {
    "skip_precondition": "precondition_verification",
    "stop_early": "multi_step_completion",
    "mispick": "structured_data_reasoning",
    "corrupt_argument": "tool_call_precision",
}
RHO = 0.10


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec, expected",
    [
        ("flawed:0.4,0,0,0.3", {"precondition_verification", "tool_call_precision"}),
        ("flawed:0,0.5,0.4,0", {"multi_step_completion", "structured_data_reasoning"}),
        # precondition faults planted, but too rarely (coverage < ρ): not selected
        ("flawed:0.02,0.5,0,0.5", {"multi_step_completion", "tool_call_precision"}),
        ("flawed:0.7,0.3,0.3,0.3", set(FAULT_CAPABILITY.values())),
    ],
)
def test_rules_selection_recovers_planted_faults(spec: str, expected: set[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rollouts.jsonl"
    assert main(["collect", "--env", "airline", "--policy", spec, "--tasks", "300", "--split", "train", "--out", str(path), "--json"]) == 0
    capsys.readouterr()
    trajectories = load_rollouts(path)
    failed = [t for t in trajectories if not t.passed]
    truth = {
        cap: sum(fault in t.info["faults"]["planted"] for t in failed) / len(failed) for fault, cap in FAULT_CAPABILITY.items()
    }
    assert {c for c, cov in truth.items() if cov >= RHO} == expected  # the mix plants what this case claims
    assert main(["select", "--rollouts", str(path), "--out", str(tmp_path / "sel"), "--json", "--bootstrap", "100"]) == 0
    doc = json.loads(capsys.readouterr().out)
    selected = {c["name"] for c in doc["capabilities"] if c["selected"]}
    assert selected == expected
    by = {c["name"]: c for c in doc["capabilities"]}
    assert not any(c["selected"] for c in doc["capabilities"] if c["decoy"])
    # the labeller's coverage matches the planted coverage; a mis-picked flight change whose write the
    # corruption then breaks reads as the corruption alone (no price is said to give the mis-pick away)
    for cap, cov in truth.items():
        assert by[cap]["mean_cov"] == pytest.approx(cov, abs=0.03), cap
