"""SWE-bench's files: real agent trajectories and reports in, predictions out (and back)."""

import json
import shutil
from pathlib import Path

import pytest

from tracerl.core.errors import InputError
from tracerl.envs.loading import load_rollouts
from tracerl.envs.swebench import read_predictions, write_predictions
from tracerl.selection.rules import RulesLabeller

DATA = Path(__file__).resolve().parents[1] / "data" / "swebench"


def test_mini_swe_agent_trajectories_become_graded_rollouts():
    rollouts = {t.task_id: t for t in load_rollouts(DATA / "mini-swe-agent")}
    assert set(rollouts) == {"django__django-16255", "django__django-10999"}
    good, bad = rollouts["django__django-16255"], rollouts["django__django-10999"]
    assert good.passed and good.reward == 1.0 and not bad.passed
    assert bad.info["FAIL_TO_PASS"] == ["test_negative (utils_tests.test_dateparse.DurationParseTests)",
                                        "test_parse_postgresql_format (utils_tests.test_dateparse.DurationParseTests)"]
    assert good.info["model_patch"].startswith("diff --git a/django/contrib/sitemaps/__init__.py")
    calls = good.tool_calls()
    assert calls and calls[0].name == "bash" and calls[0].parsed_arguments() == {"command": "ls -R django/contrib/sitemaps"}
    tool_replies = [m for m in good.messages if m.role == "tool"]
    assert len(tool_replies) == len(calls) - 1  # the submitting command ends the run: no output comes back
    assert tool_replies[0].content.startswith("<returncode>0</returncode>")
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in calls[-1].parsed_arguments()["command"]
    assert good.messages[0].role == "system" and good.messages[1].content.startswith("<pr_description>")


def test_swe_agent_trajectory_needs_a_report(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(DATA / "swe-agent" / "swe-agent__test-repo-i1.traj", folder)
    with pytest.raises(InputError, match="no evaluation report for instance swe-agent__test-repo-i1"):
        load_rollouts(folder)
    (folder / "summary.json").write_text(json.dumps({"resolved_ids": ["swe-agent__test-repo-i1"], "unresolved_ids": []}))
    (t,) = load_rollouts(folder)
    assert t.passed and [c.name for c in t.tool_calls()] == ["find_file", "open", "edit", "bash", "submit"]
    assert t.tool_kinds() == {"find_file": "read", "open": "read", "edit": "write", "bash": "write", "submit": "write"}
    assert t.tool_calls()[2].parsed_arguments()["command"].startswith("edit 4:4\ndef division")
    assert t.info["model_patch"].lstrip().startswith("diff --git a/tests/missing_colon.py")


def test_rules_labeller_reads_imported_rollouts():
    rows = RulesLabeller().label(load_rollouts(DATA / "mini-swe-agent"), [])
    assert rows == [{}, {}]


def test_predictions_round_trip_in_swebench_shape(tmp_path):
    real = read_predictions(DATA / "swe-agent" / "all_preds.jsonl")  # SWE-agent's own predictions file
    assert set(real[0]) == {"instance_id", "model_name_or_path", "model_patch"}
    rollouts = load_rollouts(DATA / "mini-swe-agent")
    out = tmp_path / "preds.jsonl"
    assert write_predictions(rollouts, out, "gemini-3-pro-preview") == 2
    back = read_predictions(out)
    assert [set(r) for r in back] == [set(real[0])] * 2
    assert {r["instance_id"]: r["model_patch"] for r in back} == {t.task_id: t.info["model_patch"] for t in rollouts}
    (tmp_path / "bad.jsonl").write_text('{"instance_id": "x", "model_patch": ""}\n')
    with pytest.raises(InputError, match="model_name_or_path"):
        read_predictions(tmp_path / "bad.jsonl")
