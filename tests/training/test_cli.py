"""`tracerl train`: a short real run, and bad input rejected before anything is written."""

import json

import pytest
import torch
from training_helpers import save_tiny_base

from tracerl.cli import main

CONFIG = """num_generations: 2
groups_per_step: 2
max_steps: 1
rollout: {max_new_tokens: 6}
eval_episodes: 2
learning_rate: 0.002
lora: {r: 4, lora_alpha: 8}
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base"))


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(CONFIG)
    return str(path)


def test_train_on_the_target_env_json(base, config, tmp_path, capsys):
    torch.set_num_threads(1)
    out = tmp_path / "grpo-airline"
    assert main(["train", "--env", "airline", "--base", base, "--out", str(out), "--config", config, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["capability"] == "airline" and summary["steps"] == 1
    assert summary["rollouts_used"] >= 4 and summary["eval_success_first"] is not None
    assert (out / "adapter_model.safetensors").exists() and (out / "checkpoint" / "state.json").exists()
    # a second run of the same settings into the same folder resumes it: a finished run does nothing more
    assert main(["train", "--env", "airline", "--base", base, "--out", str(out), "--config", config, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["resumed"] is True and again["steps"] == 1


def _fails_before_writing(args, out, capsys, *needles):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error" in err and all(n in err for n in needles), err
    assert not out.exists()


def test_bad_environment_directory(base, config, tmp_path, capsys):
    bad = tmp_path / "envs" / "broken"
    bad.mkdir(parents=True)
    (bad / "env.json").write_text('{"capability": "broken"}')  # no target, no template
    out = tmp_path / "out"
    _fails_before_writing(["train", "--env", str(bad), "--base", base, "--out", str(out), "--config", config],
                          out, capsys, "env.json")
    _fails_before_writing(["train", "--env", "no-such-env", "--base", base, "--out", str(out)], out, capsys,
                          "no-such-env")


def test_base_model_that_does_not_load(config, tmp_path, capsys):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    out = tmp_path / "out"
    _fails_before_writing(["train", "--env", "airline", "--base", str(empty), "--out", str(out), "--config", config],
                          out, capsys, "not-a-model")


def test_adapter_incompatible_with_base(base, config, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model

    from transformers import Qwen3Config, Qwen3ForCausalLM

    # a LoRA made for a model of another width

    wide = Qwen3ForCausalLM(Qwen3Config(vocab_size=300, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=12))
    adapter = tmp_path / "wide-adapter"
    get_peft_model(wide, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(adapter)
    out = tmp_path / "out"
    _fails_before_writing(["train", "--env", "airline", "--base", base, "--out", str(out), "--config", config,
                           "--adapter", str(adapter)], out, capsys, "does not fit the base model")


def test_bad_config_value(base, tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("loss_type: ppo\n")
    out = tmp_path / "out"
    _fails_before_writing(["train", "--env", "airline", "--base", base, "--out", str(out), "--config", str(cfg)],
                          out, capsys, "bad.yaml", "loss_type")


def _env_dir(root, capability="precondition_verification", module_source=None):
    from tracerl.contracts import EnvSpec
    from tracerl.envs.synthetic.envdir import write_env_dir
    from tracerl.synthesis.target import load_target

    spec = (EnvSpec(capability=capability, template=capability, target="airline") if module_source is None else
            EnvSpec(capability=capability, source="llm", module="env.py", target="airline"))
    return write_env_dir(root / capability, spec, load_target("airline"), module_source=module_source)


FLAKY = '''import random
from tracerl.synthesis.target import load_target
from tracerl.envs.synthetic.templates import TEMPLATES


class Flaky(TEMPLATES["precondition_verification"]):
    def reset(self, seed=None, options=None):  # ignores the seed: not reproducible
        return super().reset(seed=random.randrange(10**6), options=options)


def make_env(difficulty):
    return Flaky(load_target("airline"), difficulty=difficulty)
'''


def test_train_all_capability_dirs(base, config, tmp_path, capsys):
    torch.set_num_threads(1)
    envs = tmp_path / "envs"
    _env_dir(envs, "precondition_verification")
    _env_dir(envs, "tool_call_precision")
    out = tmp_path / "adapters"
    assert main(["train", "--all", "--env", str(envs), "--base", base, "--out", str(out), "--config", config,
                 "--json"]) == 0
    summaries = json.loads(capsys.readouterr().out)
    assert [s["capability"] for s in summaries] == ["precondition_verification", "tool_call_precision"]
    for s in summaries:
        assert (out / s["capability"] / "adapter_config.json").exists()
        saved = json.loads((out / s["capability"] / "train_config.json").read_text())
        assert saved["config"]["hint_fraction"] == 0.25  # the env directory's hint fraction


def test_environment_that_fails_validation(base, config, tmp_path, capsys):
    flaky = _env_dir(tmp_path / "envs", "flaky", module_source=FLAKY)
    out = tmp_path / "out"
    _fails_before_writing(["train", "--env", str(flaky), "--base", base, "--out", str(out), "--config", config],
                          out, capsys, "fails validation", "determinism")


def test_resume_with_other_settings_is_refused(base, config, tmp_path, capsys):
    torch.set_num_threads(1)
    out = tmp_path / "run"
    assert main(["train", "--env", "airline", "--base", base, "--out", str(out), "--config", config]) == 0
    # a longer run is fine; a different learning rate is not
    assert main(["train", "--env", "airline", "--base", base, "--out", str(out), "--config", config,
                 "--max-steps", "2"]) == 0
    other = tmp_path / "other.yaml"
    other.write_text(CONFIG.replace("learning_rate: 0.002", "learning_rate: 0.01"))
    capsys.readouterr()
    assert main(["train", "--env", "airline", "--base", base, "--out", str(out), "--config", str(other)]) == 2
    assert "learning_rate" in capsys.readouterr().err


def test_train_on_an_llm_written_environment_plays_it_in_the_sandbox(base, config, tmp_path, capsys):
    """GRPO on a generated environment: every episode is played through a confined worker (`SandboxedEnv`)."""
    from tracerl.synthesis.llm import EXAMPLE_MODULE

    torch.set_num_threads(1)
    env_dir = _env_dir(tmp_path / "envs", "look_then_act", module_source=EXAMPLE_MODULE)
    out = tmp_path / "adapter"
    assert main(["train", "--env", str(env_dir), "--base", base, "--out", str(out), "--config", config, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["capability"] == "look_then_act" and summary["steps"] == 1 and summary["rollouts_used"] >= 4
    assert (out / "adapter_model.safetensors").exists()
    assert sorted(p.name for p in env_dir.iterdir()) == ["env.json", "env.py", "target.json"]  # played on a copy
