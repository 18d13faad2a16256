"""The shipped tiny agent: a real Qwen3 checkpoint that from_pretrained loads, with its build record."""

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tracerl.core.policy import Session
from tracerl.envs.airline import TEST_SEEDS
from tracerl.envs.airline.reference import GREETING
from tracerl.envs.registry import make_env
from tracerl.models.factory import make_policy
from tracerl.models.tiny_agent import TINY_AGENT_DIR
from tracerl.models.chat import ChatFormat


@pytest.fixture(scope="module")
def agent():
    model = AutoModelForCausalLM.from_pretrained(TINY_AGENT_DIR)
    tokenizer = AutoTokenizer.from_pretrained(TINY_AGENT_DIR)
    return model.eval(), tokenizer


def test_it_is_a_small_qwen3_checkpoint_with_a_build_record(agent):
    model, tokenizer = agent
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.model_type == "qwen3"
    assert model.config.vocab_size == len(tokenizer)
    assert (TINY_AGENT_DIR / "model.safetensors").stat().st_size < 8_000_000
    build = json.loads((TINY_AGENT_DIR / "build.json").read_text())
    assert build["command"].startswith("tracerl build-agent")
    for key in ("seed", "policy", "episodes"):
        assert key in build["recipe"]
    assert build["model"]["parameters"] == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert build["minutes"] > 0 and build["training"]["tokens_per_second"] > 0
    assert 0.0 <= build["test"]["greedy_pass_rate"] <= 1.0


def test_its_tokenizer_round_trips_and_templates_tools(agent):
    _, tokenizer = agent
    env = make_env("airline", split="test")
    messages, _ = env.reset(seed=TEST_SEEDS[0])
    chat = ChatFormat(tokenizer)
    text = chat.render(messages, env.tools, add_generation_prompt=True)
    assert "get_reservation_details(reservation_id)" in text and text.endswith("<|im_start|>assistant\n")
    for sample in (text, "ünïcode 😀 {\"a\": [1, 2]}\t\n  x"):
        assert chat.decode(chat.encode(sample)) == sample


def test_it_plays_the_airline_opening_greedily(agent):
    policy = make_policy("model", seed=0)
    env = make_env("airline", split="test")
    messages, info = env.reset(seed=TEST_SEEDS[0])
    session = Session(messages=list(messages), tools=env.tools, info=info)
    [reply] = policy.act([session])
    assert reply.content == GREETING  # learned from the reference policy's opening
    session.messages.append(reply)
    out, *_ = env.step(reply)
    session.messages.extend(out)
    [call] = policy.act([session])
    assert call.tool_calls and call.tool_calls[0].name == "get_user_details"
    assert session.state.parse_errors == []


def test_an_adapter_of_the_embedded_agent_records_its_alias_not_this_checkouts_path(tmp_path):
    """An adapter trained here composes, loads and serves in any other installation of tracerl."""
    from peft import LoraConfig, get_peft_model

    from tracerl.models.composed.adapters import same_base
    from tracerl.models.local import load_model

    for reference in ("tiny-agent", str(TINY_AGENT_DIR)):
        model, _ = load_model(reference, device="cpu")
        out = tmp_path / reference.replace("/", "_")
        get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(out, save_embedding_layers=False)
        recorded = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
        assert recorded == "tiny-agent"
        loaded, _ = load_model(out, device="cpu")
        assert type(loaded).__name__ == "Qwen3ForCausalLM"  # its base, the adapter merged in
    assert same_base("tiny-agent", str(TINY_AGENT_DIR))
    assert not same_base("tiny-agent", str(tmp_path / "another_model"))
