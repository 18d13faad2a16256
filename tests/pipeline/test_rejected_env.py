"""An environment calibration rejected is not trained on silently: the run stops (exit 2) naming it
and its figures, or, with `train_rejected: true`, trains it and the report marks it; with
`informative`, one none of whose calibration groups had mixed rewards is left untrained, and the
report says so.
(The training path itself runs in test_pipeline_run.py, whose config rejects every environment.)"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))  # contract_cases, composition helpers (--import-mode=importlib)
sys.path.insert(0, str(Path(__file__).parents[1] / "composition"))

from tracerl.cli import main
from tracerl.config import load_run_config
from tracerl.contracts import CapabilitiesFile, EnvCalibration, EnvIndex, EnvRecord, LabelerInfo, SelectionSettings, Totals
from tracerl.core.errors import InputError
from tracerl.core.io import write_json, write_jsonl
from tracerl.evaluation.report_data import load_report_data
from tracerl.evaluation.report_html import render_html
from tracerl.pipeline import Pipeline
from tracerl.stages import fingerprint

CAP = "precondition_verification"
STATS = {"groups": 8, "group_size": 8, "mean_reward": 0.05, "success_rate": 0.0, "reward_std": 0.1,
         "mean_group_std": 0.08, "all_success": 0.0, "all_zero": 0.75, "constant": 0.75, "informative": 0.25}
REASONS = ["mean reward 0.050 outside [0.2, 0.6]", "success rate 0.000 outside [0.2, 0.6]",
           "all-zero groups 0.75 > 0.2"]


def calibration(accepted: bool, informative: float = STATS["informative"]) -> dict:
    stats = {**STATS, "informative": informative}
    return {"accepted": accepted, "difficulty": 1, "stats": stats,
            "rounds": [{"difficulty": 1, "stats": stats, "accepted": accepted, "reasons": [] if accepted else REASONS}],
            "stop_reason": "accepted" if accepted else "too hard at difficulty 0, the end of the knob",
            "bands": {}, "policy": "tiny-agent", "seeds": list(range(8)), "group_size": 8}


def synthesized_workspace(tmp_path: Path, *, accepted: bool, train_rejected: bool | str,
                          informative: float = STATS["informative"]) -> tuple[Path, Path]:
    """A config and a workspace whose collect, select and synthesize stages are complete."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(f"train_rejected: {str(train_rejected).lower()}\n")
    ws = tmp_path / "ws"
    EnvIndex(target="airline", generator="template", environments=[
        EnvRecord(capability=CAP, status="DONE", environment=CAP, source="template", calibration=EnvCalibration(
            accepted=accepted, difficulty=1, success_rate=0.0, without_signal=informative == 0, stop_reason="-"))
    ]).write(ws / "envs" / "index.json")
    write_json(ws / "envs" / CAP / "calibration.json", calibration(accepted, informative))
    write_jsonl(ws / "rollouts" / "base.jsonl", [])
    CapabilitiesFile(params=SelectionSettings(rho=0.1, delta=0.2, k=1, n=1, bootstrap=0, seed=0),
                     totals=Totals(trajectories=0, failed=0, passed=0),
                     labeler=LabelerInfo(name="rules", deterministic=True, note=""), unlabelled_pairs=0,
                     capabilities=[]).write(ws / "capabilities.json")
    for stage in Pipeline(load_run_config(config), ws).stages()[:3]:
        write_json(ws / ".stages" / f"{stage.name}.json", {"fingerprint": fingerprint(ws, stage), "summary": {}})
    return config, ws


def test_a_rejected_environment_stops_the_run_naming_it_and_its_figures(tmp_path, capsys):
    config, ws = synthesized_workspace(tmp_path, accepted=False, train_rejected=False)
    assert main(["run", str(config), "-w", str(ws)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the lines of the stages that were up to date
    assert err.startswith(f"error: {ws / 'envs' / CAP / 'calibration.json'}: ")
    assert f"calibration rejected environment '{CAP}' at difficulty 1" in err
    assert all(reason in err for reason in REASONS) and "train_rejected: true" in err
    assert not (ws / "adapters").exists()


def test_an_accepted_environment_or_the_option_passes_the_check(tmp_path):
    """With `only`, the run stops at the first stage not done: past the check, that is the training stage."""
    for accepted, train_rejected in ((True, False), (False, True), (False, False)):
        config, ws = synthesized_workspace(tmp_path / f"{accepted}-{train_rejected}", accepted=accepted,
                                           train_rejected=train_rejected)
        with pytest.raises(InputError) as err:
            Pipeline(load_run_config(config), ws).run(only={"report"})
        passed = accepted or train_rejected
        assert (f"stage 'train:{CAP}' has not run" in str(err.value)) is passed
        assert ("calibration rejected" in str(err.value)) is not passed


def test_informative_leaves_out_an_environment_without_mixed_groups(tmp_path):
    """With `train_rejected: informative` it gets no train stage, so no refusal either (with `only`, the first
    stage not done is the composition); with true it is trained, with false the run stops before it."""
    for train_rejected, first_not_done in (("informative", "compose"), (True, f"train:{CAP}"), (False, None)):
        config, ws = synthesized_workspace(tmp_path / str(train_rejected), accepted=False,
                                           train_rejected=train_rejected, informative=0.0)
        pipeline = Pipeline(load_run_config(config), ws)
        assert pipeline.trained_envs() == ([] if train_rejected == "informative" else [CAP])
        with pytest.raises(InputError) as err:
            pipeline.run(only={"report"})
        expected = f"stage '{first_not_done}' has not run" if first_not_done else "calibration rejected"
        assert expected in str(err.value)
    ws = tmp_path / "informative" / "ws"
    write_json(ws / "envs" / "tool_call_precision" / "calibration.json", calibration(False))  # trainable, not trained
    page = render_html(load_report_data(ws), {})
    calibration_section = page[page.index('id="calibration"'):page.index('id="training"')]
    assert calibration_section.count("not trained: no group with mixed rewards") == 1
    row = calibration_section[calibration_section.index(f"<b>{CAP}</b>"):]
    assert "not trained" in row[:row.index("</tr>")]


def test_the_report_marks_an_adapter_trained_on_a_rejected_environment(tmp_path):
    ws = tmp_path / "ws"
    for cap, accepted in ((CAP, False), ("tool_call_precision", True)):
        write_json(ws / "envs" / cap / "calibration.json", calibration(accepted))
        rows = [{"step": 0, "rollouts_used": 0, "eval_success": 0.0},
                {"step": 1, "rollouts_used": 16, "reward_mean": 0.1, "eval_success": 0.0}]
        (ws / "adapters" / cap).mkdir(parents=True)
        (ws / "adapters" / cap / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_json(ws / "envs" / "unused" / "calibration.json", calibration(False))  # rejected, not trained: no mark
    data = load_report_data(ws)
    assert data.trained_rejected == [CAP] and data.summary().trained_rejected == [CAP]
    page = render_html(data, {})
    assert page.count("rejected by calibration, trained anyway") == 2  # its calibration row and its training curve
    calibration_section = page[page.index('id="calibration"'):page.index('id="training"')]
    row = calibration_section[calibration_section.index(f"<b>{CAP}</b>"):]
    assert "trained anyway" in row[:row.index("</tr>")]


def test_the_composition_takes_the_trained_environments_only(tmp_path):
    """Two capabilities selected, one environment without a mixed group left out (`informative`): one
    adapter, composed alone."""
    from contract_cases import capabilities_file
    from composition_helpers import make_adapter

    from tracerl.models.composed.artifact import load_composed
    from tracerl.config import RunConfig
    from tracerl.models.local import load_model
    from tracerl.pipeline import SECTIONS
    from tracerl.stages import View

    ws = tmp_path / "ws"
    silent = "tool_call_precision"
    capabilities_file(ws / "capabilities.json", [CAP, silent])
    config = RunConfig.model_validate({"synthesize": {"calibrate": False}, "train_rejected": "informative", "compose": {
        "modes": ["moe", "router"], "moe_routing": "opening", "episodes_per_capability": 2, "gate": {"max_steps": 5},
        "target_openings": False}})  # no collect or select ran here: no target rollouts or labels to fit to
    pipeline = Pipeline(config, ws)
    pipeline.stage_fns.synthesize(View(config, SECTIONS["synthesize"]))
    index = EnvIndex.read(ws / "envs" / "index.json")
    for record in index.environments:
        record.calibration = EnvCalibration(accepted=False, difficulty=1, success_rate=0.0, stop_reason="-",
                                            without_signal=record.capability == silent)
    index.write(ws / "envs" / "index.json")
    assert index.built() == [CAP, silent] and pipeline.trained_envs() == [CAP]
    model, _ = load_model("tiny-agent")
    make_adapter(model, ws / "adapters" / CAP, seed=0, base_name="tiny-agent", scale=0.01)
    pipeline.stage_fns.compose(View(config, SECTIONS["compose"]))  # its View carries train_rejected
    for folder in ("composed", "composed_router"):
        composed = load_composed(ws / folder)
        assert [c.name for c in composed.tracerl_composition.capabilities] == [CAP]


def test_nothing_left_to_train_stops_the_run_in_one_line_naming_why(tmp_path, capsys):
    """Every environment left out by `informative` (no group of mixed rewards): the composition has no adapter, and
    the run says why in one line (exit 2) instead of the compose command's 'give at least one adapter'."""
    config, ws = synthesized_workspace(tmp_path, accepted=False, train_rejected="informative", informative=0.0)
    assert main(["run", str(config), "-w", str(ws)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"error: {ws / 'envs' / 'index.json'}: no adapter to compose: calibration found no group of mixed "
                   f"rewards in {CAP}, and train_rejected: informative leaves those out (train_rejected: true trains "
                   "them anyway)")
    assert not (ws / "composed").exists()
