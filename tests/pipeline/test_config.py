from pathlib import Path

import pytest
import yaml

from tracerl.config import DEMO_CONFIG, RunConfig, load_run_config, train_config
from tracerl.core.errors import InputError
from tracerl.cli import main


TAU2_DATA = Path(__file__).resolve().parents[1] / "data" / "tau2"


TAU2_CONFIG = DEMO_CONFIG.parents[3] / "configs" / "tau2-retail-select.yaml"  # reads tests/data/tau2


def test_demo_config_loads_and_the_example_configs_load(tmp_path):
    demo = load_run_config(DEMO_CONFIG)
    assert demo.model.base == "tiny-agent" and demo.select.labeler == "rules"
    repo = DEMO_CONFIG.parents[3]
    link = repo / "configs" / "demo.yaml"  # one file: configs/ links to the package data `tracerl demo` reads
    assert link.is_symlink() and link.resolve() == DEMO_CONFIG.resolve()
    assert demo.rollout.max_new_tokens == 256 and train_config(demo.train, demo.rollout, demo.seed).rollout == demo.rollout
    load_run_config(repo / "configs" / "qwen3-8b-gpu.yaml")
    load_run_config(TAU2_CONFIG)


@pytest.mark.parametrize(
    "text, message",
    [
        ("seed: 0\nselect:\n  rho: 2\n", "config.yaml:3: field 'select.rho'"),
        ("seed: 0\ntrain:\n  nonsense: 1\n", "config.yaml:3: field 'train.nonsense': Extra inputs"),
        ("model: [1, 2]\n", "config.yaml:1: field 'model'"),
        ("seed: [\n", "config.yaml:2: not valid YAML"),
        ("- 1\n", "config.yaml:1: a config must be a mapping"),
        ("target:\n  results: nowhere.json\n", "target.results: no such file"),
        ("model:\n  max_new_tokens: 32\n", "config.yaml:1: field 'model': Value error, 'max_new_tokens' is now rollout"),
        ("train:\n  temperature: 0.7\n", "config.yaml:1: field 'train': Value error, 'temperature' is now rollout"),
        ("train:\n  rollout: {max_new_tokens: 9}\n", "config.yaml:2: field 'train.rollout': Value error, a run config"),
    ],
)
def test_bad_config_is_one_line_with_file_and_line(tmp_path, text, message):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_run_config(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_one_rollout_block_reaches_every_stage_and_tracerl_train(tmp_path):
    from tracerl.training.config import load_config

    path = tmp_path / "run.yaml"
    path.write_text("rollout: {max_new_tokens: 48, batch_size: 8, temperature: 0.9}\ntrain: {hint_fraction: 0.5}\n")
    config = load_run_config(path)
    grpo = train_config(config.train, config.rollout, config.seed)
    assert grpo.rollout == config.rollout and grpo.model_fields_set == {"hint_fraction", "rollout", "seed"}
    assert "rollout" not in yaml.safe_load(config.to_yaml())["train"]  # saved once, at the top level
    assert load_run_config(path).model_dump() == RunConfig.model_validate(yaml.safe_load(config.to_yaml())).model_dump()
    assert load_config(path).rollout == config.rollout  # `tracerl train --config` reads a run config's block


def test_the_runs_seed_seeds_training_unless_train_sets_its_own(tmp_path):
    from tracerl.training.config import load_config

    path = tmp_path / "run.yaml"
    for text, seed in [("seed: 3\ntrain: {max_steps: 2}\n", 3), ("seed: 3\ntrain: {seed: 7}\n", 7)]:
        path.write_text(text)
        config = load_run_config(path)
        assert train_config(config.train, config.rollout, config.seed).seed == seed  # a demo seed varies its training
        assert load_config(path).seed == seed  # `tracerl train --config` reads a run config the same way


def test_run_with_bad_config_exits_2_before_anything_runs(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text("collect:\n  tasks: -3\n")
    assert main(["run", str(path), "--workspace", str(tmp_path / "ws")]) == 2
    assert "config.yaml:2" in capsys.readouterr().err
    assert not (tmp_path / "ws").exists()


@pytest.mark.slow
def test_tau2_config_selects_and_synthesizes_then_stops_and_resumes(tmp_path, capsys):
    config = TAU2_CONFIG
    ws = tmp_path / "ws"
    assert main(["run", str(config), "-w", str(ws), "--json"]) == 0
    import json

    log = json.loads(capsys.readouterr().out)
    assert [s["stage"] for s in log["stages"]] == ["collect", "select", "synthesize"]
    assert log["stages"][1]["summary"]["selected"] == ["multi_step_completion", "tool_call_precision"]
    assert sorted(p.name for p in (ws / "envs").iterdir() if p.is_dir()) == ["multi_step_completion", "tool_call_precision"]
    assert main(["run", str(config), "-w", str(ws), "--json"]) == 0
    assert not any(s["ran"] for s in json.loads(capsys.readouterr().out)["stages"])


def test_file_paths_absolute_stay_and_relative_are_the_configs(tmp_path):
    tools = (TAU2_DATA / "retail" / "tools.json").resolve()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "caps.yaml").write_text("[]\n")
    path = tmp_path / "run.yaml"
    path.write_text(f"target:\n  tools: {tools}\nselect:\n  capabilities: sub/caps.yaml\n")
    config = load_run_config(path)
    assert config.target.tools == str(tools)
    assert config.select.capabilities == str(tmp_path / "sub" / "caps.yaml")


def test_the_code_demo_config_runs_every_baseline_on_the_code_target(tmp_path):
    from pathlib import Path

    from tracerl.config import load_run_config
    from tracerl.pipeline import Pipeline

    config = load_run_config(Path(__file__).resolve().parents[2] / "configs" / "code-demo.yaml")
    assert config.target.env == "code" and config.baselines.swe_rl and config.baselines.grpo_target
    pipeline = Pipeline(config, tmp_path)
    assert {"grpo_target", "swe_rl"} <= {s.name for s in pipeline.stages()}
    assert list(pipeline.variants()) == ["base", "trace_router", "grpo_target", "swe_rl"]
