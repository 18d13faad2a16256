"""build-agent pieces: demonstrations as exact token records, the shared-prefix loss, a tiny end-to-end build."""

import json

import pytest
import torch

from tracerl.cli import main
from tracerl.models.build_agent import (AgentRecipe, _collate, build_agent, collect_demonstrations, drill_conversations, id_drills,
                                        is_drill_step, length_grouped_batches, sft_example, shared_prefix_loss)
from tracerl.models.chat import ChatFormat
from tracerl.models.generation import shared_prefix_length
from tracerl.models.tiny import tiny_qwen3, tiny_qwen3_config


@pytest.fixture(scope="module")
def demos():
    return collect_demonstrations(AgentRecipe(policy="flawed:0.5,0.5,0.5,0.5"), range(6))


def test_demonstrations_are_templated_exactly_with_loss_on_assistant_turns(demos, tokenizer):
    chat = ChatFormat(tokenizer)
    for t in demos:
        ids, mask = sft_example(chat, t)
        last = max(i for i, m in enumerate(t.messages) if m.role == "assistant")
        fresh = chat.encode(chat.render(t.messages[: last + 1], t.tools, add_generation_prompt=False))
        assert ids == fresh[:-1]  # all but the "\n" the template puts after the final <|im_end|>
        trained = chat.decode([i for i, m in zip(ids, mask) if m])
        assert trained.count("<|im_end|>") == t.num_turns
        for m in t.messages:
            if m.role == "assistant" and m.content:
                assert m.content in trained
            if m.role in ("user", "tool"):
                assert m.content not in trained


def test_shared_prefix_loss_equals_the_plain_loss():
    model = tiny_qwen3(tiny_qwen3_config(100, hidden_size=32))
    model.train()
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(1, 100, (20,), generator=g).tolist()
    batch = []
    for n in (5, 9, 3):
        ids = prefix + torch.randint(1, 100, (n,), generator=g).tolist()
        batch.append((ids, [0] * 21 + [1] * (n - 1)))
    assert shared_prefix_length([b[0] for b in batch], minimum=0) == 20
    shared, n_tokens = shared_prefix_loss(model, batch, 20, pad_id=0)
    ids, labels, attention = _collate(batch, 0)
    plain = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    assert shared.item() == pytest.approx(plain.item(), abs=1e-6)
    assert n_tokens == 20 + 5 + 9 + 3
    shared.backward()
    grad_shared = model.model.embed_tokens.weight.grad.clone()
    model.zero_grad()
    plain.backward()
    assert torch.allclose(grad_shared, model.model.embed_tokens.weight.grad, atol=1e-6)


def test_length_grouped_batches_cover_every_example_once():
    import random

    batches = length_grouped_batches(list(range(50)), 4, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(50))
    assert all(len(b) <= 4 for b in batches)


@pytest.mark.slow
def test_a_tiny_build_end_to_end(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = AgentRecipe(episodes=8, max_steps=2, drill_steps=1, drill_every=2, drill_batch_size=4, batch_size=4, drill_episodes=12,
                         hidden_size=32, num_hidden_layers=1, vocab_size=400, eval_tasks=1, test_tasks=1,
                         max_new_tokens=4, num_threads=1, warmup_steps=1)
    report = build_agent(tmp_path / "agent", recipe, command="test", log=lambda _: None)
    saved = json.loads((tmp_path / "agent" / "build.json").read_text())
    assert saved == report
    assert {"command", "recipe", "data", "model", "training", "test", "minutes"} <= set(report)
    assert report["data"]["episodes"] == 8 and report["model"]["architecture"] == "Qwen3ForCausalLM"
    assert report["machine"]["training_device"] == "cpu"
    assert report["data"]["id_drills"] >= 12 and report["training"]["steps"] == 3
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "agent")
    tok = AutoTokenizer.from_pretrained(tmp_path / "agent")
    assert type(model).__name__ == "Qwen3ForCausalLM" and tok.chat_template


def test_build_agent_bad_input_exits_2(capsys):
    assert main(["build-agent", "--policy", "oracle"]) == 2
    assert "flawed reference policy" in capsys.readouterr().err
    assert main(["build-agent", "--steps", "0"]) == 2
    assert main(["build-agent", "--device", "teapot"]) == 2
    assert "not a torch device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_build_agent_on_a_missing_gpu_exits_2(capsys):
    assert main(["build-agent", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_id_drills_end_with_a_call_that_copies_an_id_from_the_conversation(demos):
    for t in demos:
        drills = id_drills(t)
        assert drills, "every demonstration reads the user by the id the user gave"
        first = drills[0].messages[-1].tool_calls[0]
        assert first.name == "get_user_details"
        for d in drills:
            assert d.tools == [] and all(m.role != "system" for m in d.messages)
            assert d.messages == [m for m in t.messages if m.role != "system"][: len(d.messages)]
            call = d.messages[-1]
            earlier = " ".join(m.content or "" for m in d.messages[:-1] if m.role in ("user", "tool"))
            values = [v for c in call.tool_calls for v in (c.parsed_arguments() or {}).values() if isinstance(v, str)]
            assert any(len(v) >= 4 and v in earlier for v in values)


def test_drills_come_from_the_training_episodes_then_from_seeds_after_the_validation_ones():
    recipe = AgentRecipe(episodes=3, eval_tasks=2, drill_episodes=6)
    demos = collect_demonstrations(recipe, range(3))
    assert [t.seed for t in drill_conversations(recipe, demos)] == [0, 1, 2, 5, 6, 7]
    assert drill_conversations(recipe.model_copy(update={"drill_episodes": 3}), demos) == demos


def test_drill_steps_come_first_then_every_nth_step():
    assert [is_drill_step(s, 3, 4) for s in range(11)] == [True] * 3 + [False, False, False, True] * 2
    assert not any(is_drill_step(s, 0, 0) for s in range(10))
    assert [is_drill_step(s, 2, 0) for s in range(5)] == [True, True, False, False, False]
