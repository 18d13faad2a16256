"""`tracerl run` over several training processes: `distributed.nproc_per_node: 2` starts torchrun (2 gloo
processes on the CPU) for each training stage, an adapter a user trained into the workspace with
`tracerl train` is taken up by its stage, and the run ends with its evaluation and report."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))  # contract_cases (pytest runs with --import-mode=importlib)

from tracerl.cli import main
from tracerl.config import load_run_config
from tracerl.contracts import EnvIndex, TrainRun, read_metrics
from tracerl.core.io import read_json
from tracerl.pipeline import Pipeline

SMALL = """
seed: 0
model: {base: tiny-agent}
rollout: {max_new_tokens: 64, batch_size: 16}
collect: {tasks: 16}
select: {runs: 2, bootstrap: 50, max_selected: 1}
synthesize: {calibration_seeds: 2, group_size: 4, max_rounds: 1, bands: {min_reward_std: 2.0}}
train: {num_generations: 4, groups_per_step: 2, max_steps: 1, eval_steps: 1, eval_episodes: 2, max_resample_tries: 1,
        learning_rate: 0.002, lora: {r: 4, lora_alpha: 8}}
train_rejected: true
compose: {modes: [router], episodes_per_capability: 4}
baselines: {single_adapters: false, prompt_capabilities: false}
eval: {tasks: 4, bootstrap: 100}
"""


class Stop(Exception):
    pass


@pytest.mark.slow
def test_run_trains_on_ranks_and_takes_up_a_users_adapter(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the ranks' (2 processes on 2 cores)
    config = tmp_path / "small.yaml"
    config.write_text(SMALL)
    ws = tmp_path / "ws"

    def stop_after_synthesize(name: str, ran: bool, summary: dict) -> None:
        if name == "synthesize":
            raise Stop

    with pytest.raises(Stop):
        Pipeline(load_run_config(config), ws).run(on_stage=stop_after_synthesize)
    capability = EnvIndex.read(ws / "envs" / "index.json").built()[0]
    adapter = ws / "adapters" / capability
    # the user trains the capability's adapter into the workspace themselves …
    assert main(["train", "--env", str(ws / "envs" / capability), "--base", "tiny-agent", "--out", str(adapter),
                 "--config", str(config), "--json"]) == 0
    capsys.readouterr()
    rows = (adapter / "metrics.jsonl").read_text()
    # … then runs on 2 training processes per stage
    config.write_text(SMALL + "distributed: {nproc_per_node: 2}\n")
    assert main(["run", str(config), "-w", str(ws), "--json"]) == 0
    log = {s["stage"]: s for s in json.loads(capsys.readouterr().out)["stages"]}
    # the user's adapter is the stage's: resumed at its last step, nothing trained again
    assert log[f"train:{capability}"]["ran"] and log[f"train:{capability}"]["summary"]["resumed"] is True
    assert (adapter / "metrics.jsonl").read_text() == rows
    assert TrainRun.read(adapter / "train_config.json").world_size == 1
    # GRPO on the target trained on 2 ranks, in the workspace, with TRACE's budget
    grpo = ws / "baselines" / "grpo_target"
    assert TrainRun.read(grpo / "train_config.json").world_size == 2
    assert log["grpo_target"]["summary"]["rollouts_used"] == read_metrics(grpo / "metrics.jsonl")[-1].rollouts_used > 0
    # and the run ends as any run does: evaluation of every variant and the report
    assert {"eval:base", "eval:trace_router", "eval:grpo_target", "report"} <= set(log)
    assert read_json(ws / "report" / "report.json")["evaluation"]["grpo_target"]["pass1"]["mean"] >= 0.0
    # a second run finds everything done
    assert main(["run", str(config), "-w", str(ws), "--json"]) == 0
    assert not any(s["ran"] for s in json.loads(capsys.readouterr().out)["stages"])
