"""The whole pipeline on a shrunken config with the shipped tiny agent: end to end, cached, resumed."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))  # contract_cases (pytest runs with --import-mode=importlib)

from contract_cases import check_workspace

from tracerl.cli import main
from tracerl.contracts import EnvIndex, TraceCurve, read_metrics
from tracerl.core.io import read_json

SMALL = """
seed: 0
model: {base: tiny-agent}
rollout: {max_new_tokens: 96, batch_size: 32}
collect: {tasks: 32}
select: {runs: 2, bootstrap: 50, max_selected: 1}
synthesize: {calibration_seeds: 2, group_size: 4, max_rounds: 1, bands: {min_reward_std: 2.0}}
train: {num_generations: 4, groups_per_step: 2, max_steps: 2, eval_steps: 2, eval_episodes: 2, max_resample_tries: 1,
        learning_rate: 0.002, lora: {r: 4, lora_alpha: 8}}
train_rejected: true      # the bands above reject every environment: train them anyway, marked in the report
compose: {moe_routing: opening, episodes_per_capability: 4, gate: {max_steps: 20}}   # the demo's composition
baselines: {single_adapters: false}
eval: {tasks: 8, bootstrap: 100}
"""


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return path


def _results(ws: Path) -> dict:
    out = {}
    for f in sorted((ws / "eval").glob("*.json")):
        doc = read_json(f)
        out[doc["variant"]] = (doc["pass1"]["mean"], doc["per_task"], doc["rollouts_used"])
    return out


@pytest.mark.slow
def test_pipeline_end_to_end_then_cached(tmp_path, capsys, monkeypatch):
    for name in ("OPENAI_BASE_URL", "TRACERL_LLM_MODEL", "OPENAI_MODEL"):  # no analysis model: GEPA is skipped
        monkeypatch.delenv(name, raising=False)
    ws = tmp_path / "ws"
    assert main(["run", str(_config(tmp_path)), "-w", str(ws), "--json"]) == 0
    captured = capsys.readouterr()
    log = json.loads(captured.out)
    notes = [line for line in captured.err.splitlines() if "gepa" in line]
    assert len(notes) == 1 and "gepa: skipped — it needs an analysis model" in notes[0]
    stages = [s["stage"] for s in log["stages"]]
    selected = read_json(ws / "capabilities.json")
    caps = [c["name"] for c in selected["capabilities"] if c["selected"]]
    assert caps, "the tiny agent's failures select at least one capability"
    assert stages[:3] == ["collect", "select", "synthesize"]
    assert [f"train:{c}" for c in caps] == [s for s in stages if s.startswith("train:")]
    assert {"compose", "grpo_target", "eval:base", "eval:trace_moe", "eval:trace_router", "eval:grpo_target",
            "eval:prompt_capabilities", "report"} <= set(stages)
    report = read_json(ws / "report" / "report.json")
    for variant in ("base", "trace_moe", "trace_router", "grpo_target", "prompt_capabilities"):
        assert 0.0 <= report["evaluation"][variant]["pass1"]["mean"] <= 1.0
    trace_budget = report["evaluation"]["trace_moe"]["rollouts_used"]
    # routed at the opening, the gates and the router learn from the openings: the gate data plays nothing
    assert read_json(ws / "gate_data" / "summary.json")["rollouts"] == 0
    # the opening gates are fitted to the environments' openings and to every failed target opening that
    # lacked a trained capability (the rules labeller gives every run the same labels)
    built = EnvIndex.read(ws / "envs" / "index.json").built()
    labels = read_json(ws / "labels" / "run_00.json")["trajectories"]
    lacked = [t for t in labels if not t["passed"] and any(t["labels"][c]["label"] == "LACKING" for c in built)]
    assert read_json(ws / "composed" / "composition.json")["gate_training"]["target_openings"] == len(lacked) > 0
    assert trace_budget == sum(read_metrics(ws / "adapters" / c / "metrics.jsonl")[-1].rollouts_used for c in built) > 0
    assert report["evaluation"]["grpo_target"]["rollouts_used"] <= trace_budget
    # TRACE's curve: the composition of the adapters' snapshots at step 0 and at the final step (max_steps 2 =
    # eval_steps), on GRPO's validation episodes; at step 0 every adapter is zero, so it plays the base as
    # GRPO's step-0 evaluation does, on the same episodes
    curve = TraceCurve.read(ws / "curve" / "curve.json")
    assert curve.variant == "trace_moe" and [(p.step, p.episodes) for p in curve.points] == [(0, 2), (2, 2)]
    assert curve.points[0].rollouts == 0 and curve.points[-1].rollouts == trace_budget
    grpo_rows = read_metrics(ws / "baselines" / "grpo_target" / "metrics.jsonl")
    assert curve.points[0].success == grpo_rows[0].eval_success
    efficiency = report["sample_efficiency"]
    assert [(p["step"], p["rollouts"]) for p in efficiency["trace"]] == [(0, 0), (2, trace_budget)]
    assert efficiency["test"]["trace_moe"]["mean"] == report["evaluation"]["trace_moe"]["pass1"]["mean"]
    assert (ws / "config.yaml").exists() and log["report"].endswith("index.html")
    assert "gepa" not in stages and report["missing"]["gepa"].startswith("GEPA (baselines.gepa) did not run")
    # every stage that loads the model records the precision it ran in (model.dtype auto: the agent's float32)
    assert {read_json(f)["dtype"] for f in [*(ws / "eval").glob("*.json"), *ws.glob("adapters/*/train_config.json"),
                                            ws / "baselines" / "grpo_target" / "train_config.json",
                                            *ws.glob("composed*/composition.json")]} == {"float32"}
    assert {s["summary"]["dtype"] for s in log["stages"] if s["stage"].split(":")[0] in
            ("collect", "synthesize", "train", "compose", "grpo_target", "eval")} == {"float32"}
    assert all(read_json(f)["settings"]["dtype"] == "float32" for f in ws.glob("envs/*/calibration.json"))
    assert sorted(report["trained_rejected"]) == sorted(EnvIndex.read(ws / "envs" / "index.json").built())
    assert "rejected by calibration, trained anyway" in (ws / "report" / "index.html").read_text()
    # every file passed between the stages reads through its contract, and none lacks one
    read = check_workspace(ws)
    for pattern in ("capabilities.json", "envs/index.json", "envs/*/calibration.json", "adapters/*/train_config.json",
                    "adapters/*/metrics.jsonl", "gate_data/summary.json", "composed*/composition.json", "eval/*.json",
                    "curve/curve.json", "curve/*/composition.json", "report/report.json"):
        assert read.get(pattern), pattern
    # a second run changes nothing
    assert main(["run", str(_config(tmp_path)), "-w", str(ws), "--json"]) == 0
    assert not any(s["ran"] for s in json.loads(capsys.readouterr().out)["stages"])


@pytest.mark.slow
def test_pipeline_killed_mid_training_resumes_to_the_same_results(tmp_path):
    config = _config(tmp_path)
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    cmd = [sys.executable, "-m", "tracerl.cli", "run", str(config), "-w"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd + [str(reference)], check=True, env=env, capture_output=True)
    proc = subprocess.Popen(cmd + [str(killed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if list((killed / "adapters").glob("*/checkpoint*")):  # the first adapter is training
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before training started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "report").exists()
    subprocess.run(cmd + [str(killed)], check=True, env=env, capture_output=True)
    assert _results(killed) == _results(reference)
