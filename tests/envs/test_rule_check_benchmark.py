"""benchmarks/rule_checks.py classifies the teacher's requests as the teacher played them."""

import importlib.util
from pathlib import Path

from tracerl.envs.airline import task_seeds
from tracerl.envs.registry import make_env
from tracerl.models.factory import make_policy
from tracerl.envs.runner import Episode, rollout

_spec = importlib.util.spec_from_file_location("rule_checks", Path(__file__).parents[2] / "benchmarks" / "rule_checks.py")
rule_checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rule_checks)


def _summary(spec: str, **kw) -> dict:
    trajectories = rollout(lambda: make_env("airline", split="test"), make_policy(spec, make_env=lambda: make_env("airline"), **kw),
                           [Episode(seed=s) for s in task_seeds("test", 60)])
    return rule_checks.summary([row for t in trajectories for row in rule_checks.classify(t)])


def test_the_checking_teacher_checks_right_and_decides_by_it_the_skipping_one_does_everything():
    checking = _summary("oracle", rule_check=True, cite_values=True)
    skipping = _summary("flawed:1,0,0,0", rule_check=True)
    for kind, row in checking["by_kind"].items():
        assert row["requests"] > 0, kind
        assert row["checked"] == row["checked_right"] == row["decided_right"] == row["requests"]
        assert row["checked_done"] == (row["requests"] if kind.endswith("+") else 0)
        assert skipping["by_kind"][kind]["checked"] == 0
        assert skipping["by_kind"][kind]["unchecked_done"] == row["requests"]
    assert checking["wrong_answers"] == checking["wrong_cited_values"] == {}


def test_check_parts_and_differences():
    assert rule_checks.check_parts("Check: flown (available, landed) yes. Sorry") == [("flown", "available, landed", "yes")]
    rows = [{"checked": True, "said": "Check: silver or gold (regular) no, insured (no) no",
             "teacher": "Check: silver or gold (gold) yes."}]
    assert rule_checks.differences(rows) == ({"silver or gold no": 1}, {"silver or gold": 1})
