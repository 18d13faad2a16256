"""`tracerl report` on a small but complete fake workspace (every stage's files), and on broken ones."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import webbrowser
from pathlib import Path

import pytest

from tracerl.cli import main
from tracerl.contracts import (
    AdapterRef, CalibrationBands, CalibrationResult, CapabilitiesFile, Capability, CapabilityResult, CompositionSpec,
    EvalResult, FailedExample, Headline, HeadlineEntry, ReportSummary, RoutingAccuracy,
)
from tracerl.core.io import read_json, write_json, write_jsonl
from tracerl.core.messages import Message, ToolCall
from tracerl.core.tools import ToolSchema
from tracerl.core.trajectory import Trajectory
from tracerl.evaluation.report_data import answer, load_report_data, pick_examples
from tracerl.evaluation.report_html import render_html
from tracerl.evaluation.stats import Interval, bootstrap_mean, paired_difference

CAPABILITIES = ["precondition_verification", "structured_data_reasoning", "tool_calling_precision"]
TASKS = [f"test_{i}" for i in range(1, 13)]
# Which test tasks each variant passes (one greedy trial per task).
PASSES = {
    "base": {"test_1", "test_3", "test_5", "test_7"},
    "prompt_capabilities": {"test_1", "test_3", "test_5", "test_7", "test_9"},
    "grpo_target": {"test_1", "test_3", "test_5", "test_7", "test_11"},
    "adapter:precondition_verification": {"test_1", "test_3", "test_5", "test_7", "test_2"},
    "adapter:structured_data_reasoning": {"test_1", "test_3", "test_5", "test_7"},
    "adapter:tool_calling_precision": {"test_1", "test_3", "test_5", "test_10"},
    "trace_router": {"test_1", "test_3", "test_5", "test_7", "test_2", "test_11"},
    "trace_moe": {"test_1", "test_3", "test_5", "test_7", "test_2", "test_10", "test_11"},
}
ROLLOUTS = {"base": 0, "prompt_capabilities": 0, "grpo_target": 2120, "trace_router": 1920, "trace_moe": 2120,
            **{f"adapter:{c}": 640 for c in CAPABILITIES}}
TOOLS = [
    ToolSchema(name="get_reservation_details", kind="read",
               parameters={"type": "object", "properties": {"reservation_id": {"type": "string"}}}),
    ToolSchema(name="cancel_reservation", kind="write",
               parameters={"type": "object", "properties": {"reservation_id": {"type": "string"}}}),
]
SYSTEM = "You are an airline customer service agent. Follow the policy. " * 20


def episode(task_id: str, passed: bool, *, tool_text: str | None = None) -> Trajectory:
    """A τ²-style airline episode: the passing agent checks the reservation before cancelling."""
    rid = f"R{task_id.split('_')[1].zfill(5)}"
    details = tool_text or json.dumps({"reservation_id": rid, "cabin": "economy", "insurance": "no",
                                       "created_at": "2024-05-01T10:00:00", "flights": [{"origin": "SFO"}]})
    messages = [Message.system(SYSTEM), Message.user(f"Hi, please cancel my reservation {rid}.")]
    if passed:
        messages += [
            Message.assistant(tool_calls=[ToolCall.make("get_reservation_details", {"reservation_id": rid}, "c1")]),
            Message.tool(details, "c1", "get_reservation_details"),
            Message.assistant("Your booking was made within 24 hours, so it can be cancelled. Shall I proceed?"),
            Message.user("Yes please."),
            Message.assistant(tool_calls=[ToolCall.make("cancel_reservation", {"reservation_id": rid}, "c2")]),
            Message.tool(json.dumps({"status": "cancelled"}), "c2", "cancel_reservation"),
            Message.assistant("Done: reservation cancelled, refund in 5-7 days."),
        ]
    else:
        messages += [
            Message.assistant(tool_calls=[ToolCall.make("cancel_reservation", {"reservation_id": rid[:-1]}, "c1")]),
            Message.tool("Error: reservation not found", "c1", "cancel_reservation"),
            Message.assistant("I could not cancel it, sorry."),
        ]
    return Trajectory(task_id=task_id, domain="airline", seed=int(task_id.split("_")[1]), messages=messages,
                      tools=TOOLS, reward=1.0 if passed else 0.0, passed=passed,
                      termination="agent_stop" if passed else "user_stop")


def metrics_rows(n_steps: int, start: float, end: float) -> list[dict]:
    """Rows as training.trainer writes them: a step-0 evaluation row, then one row per GRPO step."""
    rows = [{"step": 0, "rollouts_used": 0, "eval_success": start, "eval_episodes": 32}]
    for step in range(1, n_steps + 1):
        frac = step / n_steps
        row = {"step": step, "rollouts_used": step * 64, "reward_mean": round(start + (end - start) * frac, 4),
               "reward_std": 0.3, "success_rate": round(start * 0.8 + (end - start) * 0.8 * frac, 4),
               "groups_sampled": 8, "informative_groups": 6, "sampling_rounds": 1, "loss": 0.1 - 0.005 * step}
        if step % 5 == 0:
            row["eval_success"] = round(start + (end - start) * frac * 0.9, 4)
            row["eval_episodes"] = 32
        row["seconds"] = 1.5
        rows.append(row)
    return rows


def capability(name: str, rank: int, selected: bool, cov: float | None, delta: float | None, runs_passed: int,
               *, decoy: bool = False, er_plus_empty_runs: int = 0, examples: tuple = (), description: str = "") -> dict:
    """One capabilities.json row (figures made up, shape as selection writes it)."""
    return CapabilityResult(
        name=name, description=description or f"{name} description", decoy=decoy, selected=selected, rank=rank,
        status="PENDING" if selected else None, mean_cov=cov, std_cov=0.05, cov_ci95=(cov and cov - 0.04, cov and cov + 0.04),
        mean_delta=delta, std_delta=None if delta is None else 0.08, delta_ci95=(delta and delta - 0.05, delta and delta + 0.05),
        mean_er_minus=delta, mean_er_plus=0.0, runs_passed=runs_passed, runs_total=10,
        er_plus_empty_runs=er_plus_empty_runs, er_plus_flag=er_plus_empty_runs > 0, unlabelled_pairs=0, per_run=[],
        example_failed=[FailedExample(index=i, task_id=t, lacking_runs=n, evidence=e) for i, (t, n, e) in enumerate(examples)],
    ).model_dump()


def make_workspace(root: Path) -> Path:
    """Every stage's files, written through their contracts (`tracerl.contracts`)."""
    ws = root / "ws"
    ws.mkdir()
    (ws / "config.yaml").write_text("target: airline\nmodel: tiny-agent\ntraining:\n  num_generations: 8\n")
    write_jsonl(ws / "rollouts" / "base.jsonl", [episode(f"train_{i}", i % 3 == 0) for i in range(1, 10)])
    CapabilitiesFile.model_validate({
        "params": {"rho": 0.1, "delta": 0.2, "k": 8, "n": 10, "bootstrap": 1000, "seed": 0},
        "totals": {"trajectories": 9, "failed": 6, "passed": 3},
        "labeler": {"name": "rules", "deterministic": True, "note": "…"}, "unlabelled_pairs": 0,
        "capabilities": [
            capability("precondition_verification", 1, True, 0.62, 0.55, 10,
                       description="Checks eligibility before a write action.",
                       examples=(("train_1", 10, "cancelled first"), ("train_2", 9, "no read"))),
            capability("structured_data_reasoning", 2, True, 0.41, 0.4, 9),
            capability("tool_calling_precision", 3, True, 0.3, 0.31, 8, er_plus_empty_runs=10,
                       examples=(("train_4", 8, "wrong id"),)),
            capability("empathetic_tone", 4, False, 0.05, 0.01, 0, decoy=True),
            capability("never_applies", 5, False, 0.0, None, 0),
        ],
    }).write(ws / "capabilities.json")
    bands = CalibrationBands(mean_reward=(0.2, 0.6), success_rate=(0.2, 0.6), min_reward_std=0.05)
    for i, cap in enumerate(CAPABILITIES):
        stats = {"groups": 20, "group_size": 16, "mean_reward": 0.35 + 0.05 * i, "success_rate": 0.3 + 0.05 * i,
                 "reward_std": 0.31, "mean_group_std": 0.25, "all_success": 0.1, "all_zero": 0.15, "constant": 0.25,
                 "informative": 0.75, "pass_at_k": {"1": 0.3 + 0.05 * i, "4": 0.6, "8": 0.72 + 0.02 * i, "16": 0.81}}
        write_json(ws / "envs" / cap / "calibration.json", CalibrationResult.model_validate({
            "accepted": True, "difficulty": 3 + i, "stats": stats,
            "rounds": [{"difficulty": 2 + i, "stats": {**stats, "mean_reward": 0.8}, "accepted": False,
                        "reasons": ["mean reward 0.800 outside [0.2, 0.6]"]},
                       {"difficulty": 3 + i, "stats": stats, "accepted": True, "reasons": []}],
            "stop_reason": "accepted", "bands": bands, "policy": "tiny-agent", "seeds": list(range(20)),
            "group_size": 16, "settings": {"temperature": 0.7}}).model_dump(mode="json"))
        _write_rows(ws / "adapters" / cap / "metrics.jsonl", metrics_rows(10, 0.3, 0.7 + 0.05 * i))
    _write_rows(ws / "baselines" / "grpo_target" / "metrics.jsonl", metrics_rows(10, 0.33, 0.4))
    base_per_task = {t: float(t in PASSES["base"]) for t in TASKS}
    for variant, passes in PASSES.items():
        per_task = {t: float(t in passes) for t in TASKS}
        pass1 = bootstrap_mean(list(per_task.values()))
        stem = variant.replace(":", "-")
        EvalResult(
            variant=variant, pass1=pass1, pass_k={"1": pass1.mean},
            diff_vs_base=None if variant == "base" else paired_difference(per_task, base_per_task),
            rollouts_used=ROLLOUTS[variant], n_tasks=len(TASKS), trials=1, mean_reward=pass1.mean,
            failures_by_capability={"precondition_verification": 12 - len(passes), "tool_calling_precision": 2},
            per_task=per_task,
        ).write(ws / "eval" / f"{stem}.json")
        if variant in ("base", "trace_moe"):
            write_jsonl(ws / "eval" / f"{stem}.jsonl", [episode(t, t in passes) for t in TASKS])
    CompositionSpec(
        model_name="composed", mode="moe", base="tiny-agent",
        adapters=[AdapterRef(name=c, path=f"../adapters/{c}") for c in CAPABILITIES],
        capabilities=[Capability(name=c, description=f"{c} description") for c in CAPABILITIES],
        slots=["base", *CAPABILITIES], gate_parameters=1560,
        routing_accuracy=RoutingAccuracy(overall=0.875, num_prompts=16, method="per-token majority of the gates",
                                         per_capability={"precondition_verification": 0.9, "tool_calling_precision": 0.85}),
    ).write(ws / "composed" / "composition.json")
    return ws


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_report(ws: Path, *extra: str) -> int:
    return main(["report", "--workspace", str(ws), *extra])


def load_summary(ws: Path) -> dict:
    return json.loads((ws / "report" / "report.json").read_text())


def summary_of(ws: Path) -> dict:
    """report.json's content without drawing the figures (the data path only: fast)."""
    return load_report_data(ws).summary().model_dump(mode="json")


def page_of(ws: Path) -> str:
    """The page without figures."""
    return render_html(load_report_data(ws), {})


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """One complete workspace and its report, built through the CLI (read-only for the tests using it)."""
    import contextlib
    import io

    ws = make_workspace(tmp_path_factory.mktemp("built"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert run_report(ws) == 0
    return ws, out.getvalue() + err.getvalue()


# ----------------------------------------------------------------------------- the full report


def test_report_of_a_complete_workspace(built):
    ws, output = built
    assert f"report: {ws / 'report' / 'index.html'}" in output and "trace_moe" in output

    summary = load_summary(ws)
    assert ReportSummary.read(ws / "report" / "report.json").model_dump(mode="json") == summary
    evaluation = summary["evaluation"]
    assert list(evaluation) == ["base", "prompt_capabilities", "grpo_target", "adapter:precondition_verification",
                                "adapter:structured_data_reasoning", "adapter:tool_calling_precision",
                                "trace_router", "trace_moe"]
    written = json.loads((ws / "eval" / "trace_moe.json").read_text())
    assert evaluation["trace_moe"]["pass1"] == written["pass1"]
    assert evaluation["trace_moe"]["pass1"]["mean"] == pytest.approx(7 / 12)
    assert evaluation["base"]["pass1"]["mean"] == pytest.approx(4 / 12)
    assert evaluation["grpo_target"]["rollouts_used"] == 2120
    assert evaluation["adapter:tool_calling_precision"]["rollouts_used"] == 640
    assert evaluation["base"]["diff_vs_base"] is None
    assert evaluation["trace_moe"]["diff_vs_base"]["mean"] == pytest.approx(3 / 12)
    assert summary["routing_accuracy"] == 0.875
    assert summary["routing_accuracy_by_capability"] == {"precondition_verification": 0.9,
                                                         "tool_calling_precision": 0.85}
    headline = summary["headline"]
    assert headline["trace"]["variant"] == "trace_moe"
    # TRACE passes test_2 and test_10 that GRPO fails; GRPO passes nothing TRACE fails: 2 of 12 tasks.
    assert headline["trace_vs_grpo_target"]["mean"] == pytest.approx(2 / 12)
    assert headline["answer"].startswith("Does TRACE help here? ")
    assert "TRACE (moe) passes 58.3% of the held-out tasks, the base agent 33.3% (+25.0 points, 95% CI [" in headline["answer"]
    html = (ws / "report" / "index.html").read_text()
    assert html.index('class="answer"') < html.index('id="headline"')  # the page opens with the answer
    # Base fails and TRACE passes test_2, test_10, test_11: the first two in natural order are shown.
    assert [e["task_id"] for e in summary["examples"]] == ["test_2", "test_10"]
    assert all(not e["base"]["passed"] and e["trace"]["passed"] for e in summary["examples"])
    assert summary["missing"] == {}
    assert summary["base_rollouts"] == {"trajectories": 9, "passed": 3}
    assert summary["calibration"]["tool_calling_precision"]["stats"]["pass_at_k"]["16"] == 0.81
    assert summary["training"]["precondition_verification"]["final"]["rollouts_used"] == 640
    assert summary["training"]["grpo_target"]["final"]["eval_success"] == pytest.approx(0.33 + 0.07 * 0.9)

    figures = summary["figures"]
    assert set(figures) == {"capabilities", "calibration", "evaluation", "sample_efficiency", "train:grpo_target",
                            *(f"train:{c}" for c in CAPABILITIES)}
    for name in figures.values():
        png = (ws / "report" / name).read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000

    page = (ws / "report" / "index.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(figures)
    assert not re.search(r'(src|href)\s*=\s*"(?!data:|#)', page), "the page must not reference any other file"
    assert "<script" not in page
    for text in ("precondition_verification", "empathetic_tone", "ER+ = 0", "Routing (moe)", "87.5%", "decoy",
                 "held-out openings of the capability environments", "tasks of the target's train split",
                 'title="cancelled first"', "2 ✗ → 3 ✓", "10% / 15% / 75%", "per-token majority of the gates",
                 "58.3%", "33.3%", "Task test_2", "Task test_10", "get_reservation_details",
                 "tool result · cancel_reservation", "Error: reservation not found", "target: airline"):
        assert text in page, text
    assert "Not available yet" not in page
    assert "budget differs" not in page  # TRACE and GRPO-on-target both used 2,120 rollouts


def _entry(variant: str, mean: float, diff: tuple[float, float, float] | None, rollouts: int) -> HeadlineEntry:
    return HeadlineEntry(variant=variant, pass1=Interval(mean=mean, low=mean - 0.05, high=mean + 0.05),
                         diff_vs_base=None if diff is None else Interval(mean=diff[0], low=diff[1], high=diff[2]),
                         rollouts_used=rollouts)


@pytest.mark.parametrize("diff, vs_grpo, grpo_rollouts, expected", [
    ((0.15, 0.08, 0.22), (0.06, 0.01, 0.11), 900,
     "Does TRACE help here? Yes: TRACE (moe) passes 40.0% of the held-out tasks, the base agent 25.0% (+15.0 points, "
     "95% CI [+8.0, +22.0]); better than GRPO on the target at 34.0% (+6.0 points, 95% CI [+1.0, +11.0]); both with "
     "900 training rollouts."),
    ((0.01, -0.03, 0.05), (-0.005, -0.04, 0.03), 1200,
     "Does TRACE help here? Not shown: TRACE (moe) passes 26.0% of the held-out tasks, the base agent 25.0% (+1.0 "
     "points, 95% CI [-3.0, +5.0]); no different from GRPO on the target at 26.5% (-0.5 points, 95% CI [-4.0, +3.0]); "
     "TRACE used 900 training rollouts, GRPO 1,200."),
    ((-0.1, -0.16, -0.04), None, None,
     "Does TRACE help here? No, it does worse: TRACE (moe) passes 15.0% of the held-out tasks, the base agent 25.0% "
     "(-10.0 points, 95% CI [-16.0, -4.0]), with 900 training rollouts."),
])
def test_the_answer_reads_the_paired_intervals(diff, vs_grpo, grpo_rollouts, expected):
    trace = _entry("trace_moe", 0.25 + diff[0], diff, 900)
    grpo = None if vs_grpo is None else _entry("grpo_target", 0.25 + diff[0] - vs_grpo[0], None, grpo_rollouts)
    headline = Headline(trace=trace, base=_entry("base", 0.25, None, 0), grpo_target=grpo, prompt_capabilities=None,
                        trace_vs_grpo_target=None if vs_grpo is None else Interval(mean=vs_grpo[0], low=vs_grpo[1], high=vs_grpo[2]),
                        routing_accuracy=None)
    assert answer(headline) == expected
    assert answer(headline.model_copy(update={"trace": None})) is None


def test_sample_efficiency_derived_from_variants_and_grpo_metrics(built):
    se = load_summary(built[0])["sample_efficiency"]
    assert se["trace"] == [] and "TRACE: curve/curve.json not written yet" in se["note"]
    # GRPO: its validation rows (steps 0, 5, 10 → rollouts 0, 320, 640; 0.33, 0.3615, 0.393 of 32 episodes)
    assert [(p["step"], p["rollouts"], p["passed"], p["episodes"]) for p in se["grpo_target"]] == [
        (0, 0, 11, 32), (5, 320, 12, 32), (10, 640, 13, 32)]
    assert se["base"]["passed"] == 11 and se["base"]["step"] == 0  # GRPO's step 0: nothing trained yet
    low, high = se["grpo_target"][0]["interval"]["low"], se["grpo_target"][0]["interval"]["high"]
    assert low < 11 / 32 < high
    assert se["best"] == {"grpo_target": {"step": 10, "success": 13 / 32, "last_step": 10, "last_success": 13 / 32}}
    assert set(se["test"]) == {"base", "trace_moe", "grpo_target"} and se["test_tasks"] == 12
    assert se["episodes"].startswith("32 held-out tasks of the target's train split")


def test_trace_curve_points_are_on_the_validation_episodes(tmp_path):
    from tracerl.contracts import CurvePoint, TraceCurve

    ws = make_workspace(tmp_path)
    curve = TraceCurve(variant="trace_moe", composed="../composed", eval_seed_start=200, points=[
        CurvePoint(step=0, rollouts=0, passed=8, episodes=32), CurvePoint(step=5, rollouts=960, passed=16, episodes=32),
        CurvePoint(step=10, rollouts=2120, passed=12, episodes=32)])
    curve.write(ws / "curve" / "curve.json")
    se = summary_of(ws)["sample_efficiency"]
    assert [(p["step"], p["rollouts"], p["passed"]) for p in se["trace"]] == [(0, 0, 8), (5, 960, 16), (10, 2120, 12)]
    assert "(seeds 200–231)" in se["episodes"] and se["note"] is None
    # TRACE's best checkpoint (step 5) beats its last: the headline says so
    assert se["best"]["trace"] == {"step": 5, "success": 0.5, "last_step": 10, "last_success": 0.375}
    notes = summary_of(ws)["headline"]["notes"]
    assert "TRACE's best validation checkpoint (step 5, 50.0%) beats its last (step 10, 37.5%)" in " ".join(notes)
    # a curve of another composition than the report's TRACE is not drawn as TRACE's
    curve.model_copy(update={"variant": "trace_router"}).write(ws / "curve" / "curve.json")
    se = summary_of(ws)["sample_efficiency"]
    assert se["trace"] == [] and "curve/curve.json measures trace_router, not trace_moe" in se["note"]
    curve.model_copy(update={"points": [], "note": "train.eval_episodes is 0"}).write(ws / "curve" / "curve.json")
    assert "TRACE: train.eval_episodes is 0" in summary_of(ws)["sample_efficiency"]["note"]


def test_report_is_deterministic_and_a_bad_input_leaves_it_untouched(tmp_path):
    ws = make_workspace(tmp_path)
    assert run_report(ws) == 0
    first = {p.name: p.read_bytes() for p in (ws / "report").iterdir()}
    assert run_report(ws) == 0
    assert {p.name: p.read_bytes() for p in (ws / "report").iterdir()} == first
    (ws / "eval" / "base.json").write_text("{")
    assert run_report(ws) == 2
    assert {p.name: p.read_bytes() for p in (ws / "report").iterdir()} == first


def test_a_live_targets_grader_is_recorded_and_shown(tmp_path):
    from tracerl.evaluation.evaluate import summarize_variant

    user = {"model": "user-sim", "base_url": "http://127.0.0.1:8001/v1", "temperature": 0.0, "max_tokens": None}
    trajectories = [episode(t, t in PASSES["base"]) for t in TASKS]
    for i, t in enumerate(trajectories):
        t.info.update(source="tau2-live", tau2_version="1.0.1", reward_basis=["DB", "COMMUNICATE"][: 1 + i % 2],
                      user_simulator=user, judge=None)
    result = summarize_variant("base", trajectories, rollouts_used=0, bootstrap=100)
    assert result.grading.model_dump() == {"grader": "τ²-bench 1.0.1", "reward_basis": ["COMMUNICATE", "DB"],
                                           "user_simulator": user, "judge": None}
    builtin = summarize_variant("base", [episode(TASKS[0], True)], rollouts_used=0, bootstrap=100)
    assert builtin.grading is None
    ws = make_workspace(tmp_path)
    base = EvalResult.read(ws / "eval" / "base.json")
    base.model_copy(update={"grading": result.grading}).write(ws / "eval" / "base.json")
    assert ("Graded live by τ²-bench 1.0.1: reward basis COMMUNICATE, DB; user simulator user-sim at "
            "http://127.0.0.1:8001/v1, temperature 0.0; NL-assertion judge none.") in page_of(ws)


# ----------------------------------------------------------------------------- escaping and truncation


def test_every_string_from_the_data_is_escaped(tmp_path):
    ws = make_workspace(tmp_path)
    caps = json.loads((ws / "capabilities.json").read_text())
    caps["capabilities"][0]["description"] = '<script>alert("cap")</script> & "quoted"'
    caps["capabilities"][0]["example_failed"][0]["task_id"] = "<b>decoy</b>"
    write_json(ws / "capabilities.json", caps)
    trajectories = [episode(t, t in PASSES["base"]) for t in TASKS]
    trajectories[1].messages[1] = Message.user('<img src=x onerror="alert(1)"> cancel </div>')
    write_jsonl(ws / "eval" / "base.jsonl", trajectories)
    page = page_of(ws)
    assert "<script" not in page and "<img src=x" not in page and "<b>decoy</b>" not in page
    assert "&lt;script&gt;alert(&quot;cap&quot;)&lt;/script&gt; &amp; &quot;quoted&quot;" in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt; cancel &lt;/div&gt;" in page
    assert "&lt;b&gt;decoy&lt;/b&gt;" in page


def test_long_tool_results_are_cut(tmp_path):
    ws = make_workspace(tmp_path)
    long_text = "x" * 4000 + "TAIL-MARKER"
    write_jsonl(ws / "eval" / "trace_moe.jsonl",
                [episode(t, t in PASSES["trace_moe"], tool_text=long_text) for t in TASKS])
    page = page_of(ws)
    assert "TAIL-MARKER" not in page
    assert f"(+{len(long_text) - 600:,} characters)" in page


# ----------------------------------------------------------------------------- missing and malformed parts


def test_stages_not_run_yet_are_reported_as_missing(tmp_path, capsys):
    ws = tmp_path / "ws"
    ws.mkdir()
    write_jsonl(ws / "rollouts" / "base.jsonl", [episode("train_1", False), episode("train_2", True)])
    assert run_report(ws) == 0
    summary = load_summary(ws)
    assert summary["evaluation"] == {} and summary["routing_accuracy"] is None and summary["figures"] == {}
    assert set(summary["missing"]) == {"config", "capabilities", "calibration", "training", "evaluation",
                                      "composition", "sample_efficiency", "examples"}
    page = (ws / "report" / "index.html").read_text()
    for section in ("capabilities", "calibration", "training", "evaluation", "sample-efficiency", "examples"):
        body = page.split(f'<section id="{section}">', 1)[1].split("</section>", 1)[0]
        assert "Not available yet" in body, section
    assert "has not run yet" in capsys.readouterr().out


@pytest.mark.parametrize("removed, missing", [
    ("eval/base.jsonl", "examples"),
    ("composed", "composition"),
    ("adapters", "training"),
])
def test_one_stage_missing(tmp_path, removed, missing):
    ws = make_workspace(tmp_path)
    path = ws / removed
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    summary = summary_of(ws)
    assert set(summary["missing"]) == {missing}
    assert summary["evaluation"]["trace_moe"]["pass1"]["mean"] == pytest.approx(7 / 12)


def test_trace_router_stands_in_when_moe_is_missing(tmp_path):
    ws = make_workspace(tmp_path)
    (ws / "eval" / "trace_moe.json").unlink()
    (ws / "eval" / "trace_moe.jsonl").rename(ws / "eval" / "trace_router.jsonl")
    summary = summary_of(ws)
    assert summary["headline"]["trace"]["variant"] == "trace_router"
    assert summary["sample_efficiency"]["test"]["trace_router"]["mean"] == pytest.approx(6 / 12)
    assert summary["examples"]  # drawn from trace_router.jsonl


def test_a_merge_composition_is_trace_when_it_is_the_only_one(tmp_path):
    ws = make_workspace(tmp_path)
    merged = read_json(ws / "eval" / "trace_router.json")
    write_json(ws / "eval" / "trace_merge.json", {**merged, "variant": "trace_merge"})
    for name in ("trace_moe.json", "trace_router.json"):
        (ws / "eval" / name).unlink()
    summary = summary_of(ws)
    assert summary["headline"]["trace"]["variant"] == "trace_merge"
    assert list(summary["evaluation"])[-1] == "trace_merge"


def _rename_in_capabilities(ws: Path) -> None:
    doc = read_json(ws / "capabilities.json")
    doc["capabilities"][0]["cov_ci"] = doc["capabilities"][0].pop("cov_ci95")
    write_json(ws / "capabilities.json", doc)


def _flat_calibration(ws: Path) -> None:
    path = ws / "envs" / "tool_calling_precision" / "calibration.json"
    cal = read_json(path)
    write_json(path, {**cal.pop("stats"), **cal})


def _rollouts_for_rollouts_used(ws: Path) -> None:
    (ws / "adapters" / "tool_calling_precision" / "metrics.jsonl").write_text('{"step": 0, "rollouts": 0}\n')


def _routing_accuracy_as_a_number(ws: Path) -> None:
    write_json(ws / "composed" / "composition.json", {**read_json(ws / "composed" / "composition.json"), "routing_accuracy": 0.5})


def _older_composition_format(ws: Path) -> None:
    write_json(ws / "composed" / "composition.json",
               {**read_json(ws / "composed" / "composition.json"), "format": "tracerl.composition/1"})


def _variant_of_another_file(ws: Path) -> None:
    (ws / "eval" / "grpo_target.json").write_text((ws / "eval" / "base.json").read_text())


@pytest.mark.parametrize("edit, message", [
    (_rename_in_capabilities, "capabilities.json: missing field 'capabilities.0.cov_ci95' (and 1 more)"),
    (_flat_calibration, "calibration.json: missing field 'stats'"),
    (_rollouts_for_rollouts_used, "metrics.jsonl:1: missing field 'rollouts_used' (and 1 more)"),
    (_routing_accuracy_as_a_number, "composition.json: field 'routing_accuracy'"),
    (_older_composition_format, "composition.json: field 'format': Value error, unknown format 'tracerl.composition/1'"),
    (_variant_of_another_file, "grpo_target.json: variant 'base' does not match the file name"),
], ids=["renamed-field", "flat-calibration", "rollouts", "routing-number", "old-format", "variant"])
def test_a_file_that_does_not_fit_its_contract_is_a_one_line_error(tmp_path, capsys, edit, message):
    """Each file has one shape: an old field name or another shape is an error naming the file, not read."""
    ws = make_workspace(tmp_path)
    edit(ws)
    assert run_report(ws) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (ws / "report").exists()


def test_unequal_budgets_are_flagged(tmp_path):
    ws = make_workspace(tmp_path)
    grpo = json.loads((ws / "eval" / "grpo_target.json").read_text())
    write_json(ws / "eval" / "grpo_target.json", {**grpo, "rollouts_used": 1000})
    assert "budget differs from TRACE's (2,120)" in page_of(ws)


@pytest.mark.parametrize("path, content, message", [
    ("capabilities.json", '{"capabilities": [', "capabilities.json:1: not valid JSON"),
    ("capabilities.json", '{"capabilities": [{"name": "x"}]}', "capabilities.json: missing field 'params'"),
    ("envs/tool_calling_precision/calibration.json", '{"pass_at_k": {"one": 0.5}}', "calibration.json: missing field"),
    ("adapters/tool_calling_precision/metrics.jsonl", '{"step": 0, "rollouts_used": 0}\n{"rollouts_used": 64}\n',
     "metrics.jsonl:2: missing field 'step'"),
    ("eval/base.json", '{"variant": "base", "pass1": {"mean": 1.5, "low": 0.2, "high": 0.4}, "rollouts_used": 0}',
     "base.json: field 'pass1'"),
    ("eval/trace_moe.jsonl", '{"task_id": "t"}\n', "trace_moe.jsonl:1: missing field"),
    ("composed/composition.json", '{"routing_accuracy": "high"}', "composition.json: missing field 'model_name'"),
    ("config.yaml", "a: [1, 2\n", "config.yaml:"),
])
def test_a_malformed_file_is_a_one_line_error_naming_it(tmp_path, capsys, path, content, message):
    ws = make_workspace(tmp_path)
    (ws / path).write_text(content)
    assert run_report(ws) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (ws / "report").exists(), "nothing may be written when an input is malformed"


def test_missing_workspace_is_an_input_error(tmp_path, capsys):
    assert run_report(tmp_path / "nope") == 2
    assert "workspace folder does not exist" in capsys.readouterr().err


def test_pick_examples_prefers_base_failed_trace_passed_then_disagreements():
    base = {t: episode(t, ok) for t, ok in [("t_1", True), ("t_2", True), ("t_3", False), ("t_10", True)]}
    trace = {t: episode(t, ok) for t, ok in [("t_1", True), ("t_2", False), ("t_3", True), ("t_10", True)]}
    assert pick_examples(base, trace) == ["t_3", "t_2"]
    assert pick_examples(base, trace, n=4) == ["t_3", "t_2", "t_1", "t_10"]
    assert pick_examples({"a": base["t_1"]}, trace) == []


# ----------------------------------------------------------------------------- opening and rendering


def test_open_starts_the_users_browser_on_the_report(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(0o755)
    monkeypatch.setenv("BROWSER", str(browser))
    monkeypatch.setattr(webbrowser, "_tryorder", None)  # make webbrowser read $BROWSER again
    monkeypatch.setattr(webbrowser, "_browsers", {})
    assert run_report(ws, "--open") == 0
    assert opened.read_text().strip() == (ws / "report" / "index.html").resolve().as_uri()


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if path is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium is required in CI for the report rendering test (scripts/test.sh installs it)")
        pytest.skip("chromium not installed (outside CI)")
    return path


def render(chromium: str, page: Path, screenshot: Path, profile: Path) -> list[str]:
    """Screenshot `page` in headless Chromium; the console messages and page errors it logged."""
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", f"--screenshot={screenshot}", "--window-size=1280,2000",
         "--enable-logging=stderr", "--v=0", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def test_chromium_missing_fails_in_ci_and_skips_outside(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no browser on it
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is required in CI"):
        _chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        _chromium()


@pytest.mark.slow
def test_report_renders_in_headless_chromium_without_console_errors(built, tmp_path):
    chromium = _chromium()
    # The check itself must be able to fail: a page with a script error is caught.
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>console.error('boom'); missingFunction();</script></body></html>")
    assert render(chromium, broken, tmp_path / "broken.png", tmp_path / "profile-broken")

    ws = built[0]
    screenshot = tmp_path / "report.png"
    assert render(chromium, ws / "report" / "index.html", screenshot, tmp_path / "profile") == []
    png = screenshot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 50_000  # a blank 1280×2000 page is ~10 KB


def test_swe_rl_stands_beside_grpo_on_the_target(tmp_path):
    """A code target's SWE-RL baseline: its validation checkpoints in the sample-efficiency section (the
    same episodes as GRPO's), its test pass^1 and TRACE − SWE-RL in the headline and its answer."""
    ws = make_workspace(tmp_path)
    _write_rows(ws / "baselines" / "swe_rl" / "metrics.jsonl", metrics_rows(10, 0.33, 0.36))
    per_task = {t: float(t in PASSES["base"] | {"test_2"}) for t in TASKS}  # TRACE passes test_2, test_10, test_11 more
    pass1 = bootstrap_mean(list(per_task.values()))
    base_per_task = {t: float(t in PASSES["base"]) for t in TASKS}
    EvalResult(variant="swe_rl", pass1=pass1, pass_k={"1": pass1.mean}, diff_vs_base=paired_difference(per_task, base_per_task),
               rollouts_used=2120, n_tasks=len(TASKS), trials=1, mean_reward=pass1.mean, failures_by_capability={},
               per_task=per_task).write(ws / "eval" / "swe_rl.json")
    summary = summary_of(ws)
    se = summary["sample_efficiency"]
    # steps 0, 5, 10 → 0.33, 0.3435, 0.357 of 32 episodes: 11, 11, 11 passed
    assert [(p["step"], p["rollouts"], p["passed"], p["episodes"]) for p in se["swe_rl"]] == [
        (0, 0, 11, 32), (5, 320, 11, 32), (10, 640, 11, 32)]
    assert set(se["test"]) == {"base", "trace_moe", "grpo_target", "swe_rl"} and "swe_rl" in se["best"]
    headline = summary["headline"]
    assert headline["swe_rl"]["rollouts_used"] == 2120
    assert headline["trace_vs_swe_rl"]["mean"] == pytest.approx(2 / 12)  # test_10 and test_11
    assert "SWE-RL at 41.7%" in headline["answer"] and headline["answer"].endswith("all with 2,120 training rollouts.")
    assert list(summary["evaluation"]).index("swe_rl") == list(summary["evaluation"]).index("grpo_target") + 1
    page = page_of(ws)
    assert "SWE-RL (same budget)" in page and "TRACE − SWE-RL" in page and "<td>SWE-RL</td>" in page
