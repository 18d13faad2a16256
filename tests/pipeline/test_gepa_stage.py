"""The gepa stage in `tracerl run`: with an analysis model (a real OpenAI-compatible server on loopback, the
tiny agent behind `tracerl serve`'s server) GEPA runs at TRACE's rollout budget and its prompt is evaluated
as the `gepa` variant. (Without one it is skipped with a one-line note: tests/pipeline/test_pipeline_run.py.)"""

from __future__ import annotations

import json

import pytest

from tracerl.cli import main
from tracerl.contracts import PromptOptimization
from tracerl.core.io import read_json, read_jsonl
from tracerl.core.trajectory import Trajectory

RUN = """
seed: 0
model: {{base: tiny-agent}}
rollout: {{max_new_tokens: 64, batch_size: 16}}
collect: {{tasks: 8}}
select: {{runs: 2, bootstrap: 50, max_selected: 1}}
synthesize: {{calibration_seeds: 2, group_size: 2, max_rounds: 1, bands: {{min_reward_std: 2.0}}}}
train: {{num_generations: 2, groups_per_step: 2, max_steps: 2, eval_steps: 2, eval_episodes: 2, max_resample_tries: 1,
        learning_rate: 0.002, lora: {{r: 4, lora_alpha: 8}}}}
train_rejected: true
compose: {{modes: [router], episodes_per_capability: 2}}
baselines: {{single_adapters: false, prompt_capabilities: false, grpo_target: false}}
{analysis}
gepa: {{train_tasks: 4, val_tasks: 2, reflection_minibatch_size: 2, reflection_max_tokens: 24, transcript_chars: 300}}
eval: {{tasks: 4, bootstrap: 100}}
"""


@pytest.fixture(scope="module")
def reflector():
    from tracerl.models.local import LocalPolicy, load_model
    from tracerl.serve.server import ServerThread

    model, tokenizer = load_model("tiny-agent")
    with ServerThread(LocalPolicy(model, tokenizer), served_model_name="tiny-agent", max_batch_size=2) as server:
        yield server.base_url


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_gepa_variant_at_traces_budget(reflector, tmp_path, capsys, monkeypatch):
    for name in ("OPENAI_BASE_URL", "TRACERL_LLM_MODEL", "OPENAI_MODEL"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "run.yaml"
    config.write_text(RUN.format(analysis=f"analysis: {{base_url: '{reflector}', model: tiny-agent}}"))
    ws = tmp_path / "ws"
    assert main(["run", str(config), "-w", str(ws), "--json"]) == 0
    stages = [s["stage"] for s in json.loads(capsys.readouterr().out)["stages"]]
    assert stages.index("gepa") > stages.index("compose") and "eval:gepa" in stages
    result = PromptOptimization.read(ws / "baselines" / "gepa" / "result.json")
    trace = read_json(ws / "eval" / "trace_router.json")
    gepa = read_json(ws / "eval" / "gepa.json")
    # GEPA's budget is TRACE's, counted the same way; it never passes it
    assert result.budget == trace["rollouts_used"] > 0 and gepa["rollouts_used"] == result.rollouts_used <= result.budget
    assert result.reflection["base_url"] == reflector and result.candidates[0].discovered_at == 0
    # the gepa variant plays its best prompt on the test tasks, and the base model does the rest
    played = read_jsonl(ws / "eval" / "gepa.jsonl", Trajectory)
    assert {t.messages[0].content for t in played} == {result.best_prompt}
    base = read_json(ws / "eval" / "base.json")
    if result.best == 0:  # the target's own prompt: greedy, the same episodes as the base model's
        assert gepa["per_task"] == base["per_task"]
    report = read_json(ws / "report" / "report.json")
    assert report["headline"]["gepa"]["rollouts_used"] == result.rollouts_used and "gepa" not in report["missing"]
    assert report["sample_efficiency"]["test"]["gepa"]["mean"] == gepa["pass1"]["mean"]
    # its running-best prompts were played on the curve's validation episodes (train.eval_episodes of them)
    assert all(c.curve_episodes == 2 for c in result.candidates[1:] if c.curve_episodes is not None)
    assert len(result.curve_seeds) == 2 and not set(result.curve_seeds) & set(result.train_seeds + result.val_seeds)
    assert "GEPA prompt (same budget)" in (ws / "report" / "index.html").read_text()
