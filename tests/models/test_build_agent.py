"""build-agent pieces: demonstrations as exact token records, the shared-prefix loss, a tiny end-to-end build."""

import json

import pytest
import torch

from tracerl.cli import main
from tracerl.envs.airline import AirlineEnv
from tracerl.envs.airline.reference import scripted_policy_from_spec
from tracerl.envs.runner import Episode, rollout
from tracerl.models.build_agent import (AgentRecipe, _collate, answered_value_examples, build_agent, collect_demonstrations,
                                        conversation_texts, copied_values, copy_drills, drill_conversations, drill_kinds,
                                        exact_final_turns, final_turn_start, id_read_drills, is_drill_step, length_grouped_batches,
                                        load_recipe, said_value_drills, sft_example, shared_prefix_loss, train_sft)
from tracerl.commands.build_agent import SHIPPED_RECIPE
from tracerl.models.chat import ChatFormat
from tracerl.models.generation import shared_prefix_length
from tracerl.models.tiny import count_parameters, tiny_qwen3, tiny_qwen3_config


KINDS = {t.name: t.kind for t in AirlineEnv().tools}


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
                         drill_extra_max=0, hidden_size=32, num_hidden_layers=1, vocab_size=400, eval_tasks=1, test_tasks=1,
                         max_new_tokens=4, num_threads=1, warmup_steps=1)
    report = build_agent(tmp_path / "agent", recipe, command="test", log=lambda _: None)
    saved = json.loads((tmp_path / "agent" / "build.json").read_text())
    assert saved == report
    assert {"command", "recipe", "data", "model", "training", "test", "minutes"} <= set(report)
    assert report["data"]["episodes"] == 8 and report["model"]["architecture"] == "Qwen3ForCausalLM"
    assert report["machine"]["training_device"] == "cpu"
    assert report["data"]["copy_drills"] >= 12 and report["training"]["steps"] == 3
    assert [c["step"] for c in report["drill_checks"]] == [1]  # checked once, no extra steps allowed
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "agent")
    tok = AutoTokenizer.from_pretrained(tmp_path / "agent")
    assert type(model).__name__ == "Qwen3ForCausalLM" and tok.chat_template
    assert len(tok.encode("437")) == 1 and model.config.vocab_size == len(tok)  # number tokens saved with it


def test_the_shipped_build_json_is_the_recipe_that_rebuilds_it():
    """`--recipe build.json` gives exactly the recipe the shipped agent was built with: every field its
    build.json records, each the same value, and the options its recorded command set (the flags were
    renamed copies of these fields; the others kept their defaults, warm-up min(30, steps / 10) = 30)."""
    saved = json.loads(SHIPPED_RECIPE.read_text())
    recipe = load_recipe(SHIPPED_RECIPE)
    assert saved["command"] == ("tracerl build-agent --out /work/agent_runs/v42 --seed 1 --threads 1 --json-keys "
                                "--untied-embeddings --rule-check --cite-values --hinted-share 0.25")
    assert {k: v for k, v in recipe.model_dump().items() if k in saved["recipe"]} == saved["recipe"]
    assert set(recipe.model_dump()) - set(saved["recipe"]) == {"domain"} and recipe.domain == "airline"
    assert recipe == AgentRecipe(seed=1, num_threads=1, json_keys=True, tie_embeddings=False, rule_check=True,
                                 cite_values=True, hinted_share=0.25)
    assert load_recipe(SHIPPED_RECIPE) == AgentRecipe.model_validate(saved["recipe"])  # a bare recipe file reads alike


def test_the_teacher_plays_the_demonstrations_the_airline_policy_played():
    """The builder reaches the domain through its teacher only, and gets the same episodes as from the
    domain's own policy and environment (the hinted draw seeded as before)."""
    recipe = load_recipe(SHIPPED_RECIPE)
    import random

    rng = random.Random(f"tracerl-hinted-{recipe.seed}")
    episodes = [Episode(seed=s, options={"hint": True} if rng.random() < recipe.hinted_share else {}) for s in range(8)]
    direct = rollout(lambda: AirlineEnv(split="train"), scripted_policy_from_spec(
        recipe.policy, seed=recipe.seed, rule_check=True, cite_values=True), episodes)
    assert collect_demonstrations(recipe, range(8)) == direct
    assert recipe.teacher().seeds("test", 2) == [1_000_000, 1_000_001]


def test_build_agent_bad_input_exits_2(capsys, tmp_path):
    def bad(**fields):
        path = tmp_path / "recipe.json"
        path.write_text(json.dumps(fields))
        return ["build-agent", "--recipe", str(path)]

    assert main(bad(policy="oracl")) == 2
    assert "teacher of 'airline'" in capsys.readouterr().err
    assert main(bad(max_steps=0)) == 2
    assert main(bad(number_digits=4)) == 2
    assert "number_digits" in capsys.readouterr().err
    assert main(bad(hinted_share=1.5)) == 2
    assert main(bad(cite_values=True)) == 2
    assert "cite_values needs rule_check" in capsys.readouterr().err
    assert main(bad(domain="code", rule_check=True)) == 2
    assert "take no option rule_check" in capsys.readouterr().err
    assert main(bad(steps=10)) == 2
    assert "steps" in capsys.readouterr().err  # an unknown field (the old flag's name) is refused
    assert main(["build-agent", "--device", "teapot"]) == 2
    assert "not a torch device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_build_agent_on_a_missing_gpu_exits_2(capsys):
    assert main(["build-agent", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_hinted_demonstrations_carry_the_guidance_and_follow_it():
    """About the share asked for, seeded; a hinted episode never skips the rule, so with p1 = 1 the
    hinted ones check and pass where the others do forbidden requests anyway."""
    recipe = AgentRecipe(seed=2, policy="flawed:1,0,0,0", rule_check=True, hinted_share=0.5)
    demos = collect_demonstrations(recipe, range(120))
    hinted = [t for t in demos if "## Expert guidance" in t.messages[0].content]
    assert {t.seed for t in hinted} == {t.seed for t in collect_demonstrations(recipe, range(120)) if t.info.get("hint")}
    assert 40 <= len(hinted) <= 80
    checks = lambda t: any(m.content and m.content.startswith("Check:") for m in t.messages)  # noqa: E731
    assert all(t.passed for t in hinted) and sum(map(checks, hinted)) >= 20
    plain = [t for t in demos if t not in hinted]
    assert not any(map(checks, plain)) and not all(t.passed for t in plain)


def test_copy_drills_end_with_a_turn_that_copies_a_value_from_the_conversation(demos):
    for t in demos:
        drills = copy_drills(t)
        assert drills, "every demonstration reads the user by the id the user gave"
        first = drills[0].messages[-1].tool_calls[0]
        assert first.name == "get_user_details"
        turns = [m for m in t.messages if m.role != "system"]
        for d in drills:
            assert d.tools == [] and d.messages[0].role == "user" and d.messages[-1].role == "assistant"
            assert any(turns[i: i + len(d.messages)] == d.messages for i in range(len(turns)))  # a contiguous part
            earlier = " ".join(m.content or "" for m in d.messages[:-1] if m.role in ("user", "tool"))
            assert any(value in earlier for _, value in copied_values(d.messages[-1]))


def test_a_compensation_check_that_cites_words_only_is_not_drilled():
    recipe = AgentRecipe(seed=1, rule_check=True, cite_values=True, hinted_share=1.0)
    demo = next(t for t in collect_demonstrations(recipe, range(60))
                if any(m.role == "assistant" and "silver or gold (" in (m.content or "") for m in t.messages))
    check = next(m for m in demo.messages if m.role == "assistant" and "silver or gold (" in (m.content or ""))
    assert not [d for d in copy_drills(demo) if d.messages[-1] == check]


CHANGE = "I will change this reservation to flight"


def test_a_new_flight_is_drilled_from_the_date_answer_whose_search_found_it():
    demo = next(t for t in collect_demonstrations(AgentRecipe(policy="oracle"), range(40))
                if any(m.role == "assistant" and CHANGE in (m.content or "") for m in t.messages))
    confirmation = next(m for m in demo.messages if m.role == "assistant" and CHANGE in (m.content or ""))
    flight = next(v for _, v in copied_values(confirmation) if v.startswith("HAT"))
    [drill] = [d for d in copy_drills(demo) if d.messages[-1] == confirmation]
    assert any(m.role == "tool" and f'"flight_number": "{flight}"' in m.content for m in drill.messages)
    date = next(v for _, v in copied_values(confirmation) if v.startswith("2024-"))
    assert drill.messages[0].role == "user" and drill.messages[0].content == f"On {date}."  # the date asked for before the search


def test_copied_values_of_calls_and_texts():
    from tracerl.core.messages import Message, ToolCall

    call = Message.assistant(tool_calls=[ToolCall.make("update_reservation_flights", {
        "cabin": "economy", "flights": [{"date": "2024-05-18", "flight_number": "HAT955"}], "payment_id": "gift_card_oak",
        "reservation_id": "owl_pine", "total": 12, "count": 3, "ok": True}, "call_1")])
    assert copied_values(call) == [("cabin", "economy"), ("date", "2024-05-18"), ("flight_number", "HAT955"),
                                   ("payment_id", "gift_card_oak"), ("reservation_id", "owl_pine"), ("total", "12")]
    text = Message.assistant("I will change this reservation to flight HAT955 on 2024-05-18 from SFO. It costs 406 dollars for 3 passengers.")
    assert copied_values(text) == [(None, "HAT955"), (None, "2024-05-18"), (None, "SFO"), (None, "406")]
    assert copied_values(Message.assistant("Please tell me your next request.")) == []


def test_a_write_is_drilled_from_the_request_that_names_its_ids():
    """A later request's write starts at the user's message of that request (which names the
    reservation and the payment id), not at the user details that list them among others; the
    user confirms, then names the payment id again when asked for it."""
    demo = next(t for t in collect_demonstrations(AgentRecipe(policy="oracle"), range(60))
                if [m.content for m in t.messages if m.role == "user" and (m.content or "").startswith("Second, I want to add")])
    drill = min((d for d in copy_drills(demo) if d.messages[-1].tool_calls and d.messages[-1].tool_calls[0].name == "update_reservation_baggages"),
                key=lambda d: len(d.messages))
    arguments = drill.messages[-1].tool_calls[0].parsed_arguments()
    opening = drill.messages[0].content
    assert opening.startswith("Second, I want to add")
    assert arguments["reservation_id"] in opening and arguments["payment_id"] in opening
    assert [m.content for m in drill.messages if m.role == "user"] == [opening, "yes", f"Please use {arguments['payment_id']}."]


def test_answered_values_are_the_payment_and_the_date_the_user_gave_when_asked():
    """Each example ends with the value's last token, its mask marking only that value in the final
    turn; the values are exactly the user's answers ("Please use <id>.", "On <date>.")."""
    from tracerl.models.templates import TINY_AGENT_TEMPLATE
    from tracerl.models.tokenizer import train_tokenizer

    demos = collect_demonstrations(AgentRecipe(policy="oracle"), range(60))
    bootstrap = ChatFormat(train_tokenizer(["x"], vocab_size=300, chat_template=TINY_AGENT_TEMPLATE))
    tokenizer = train_tokenizer(conversation_texts(bootstrap, demos), vocab_size=600, chat_template=TINY_AGENT_TEMPLATE,
                                number_digits=3, json_keys=True)
    chat = ChatFormat(tokenizer)
    marked, answers = [], []
    for t in demos:
        drills = copy_drills(t)
        for ids, mask in answered_value_examples(chat, tokenizer, drills, KINDS):
            assert len(ids) == len(mask) and mask[-1] == 1
            marked.append(tokenizer.decode([i for i, m in zip(ids, mask) if m]))
        answers += [m.content for d in drills for m in d.messages[-2:-1] if m.role == "user"]
    asked = {a.removeprefix("Please use ").removeprefix("On ").removesuffix(".") for a in answers
             if a.startswith(("Please use ", "On "))}
    assert {v[:5] for v in marked} >= {"gift_", "credi", "2024-"}
    assert set(marked) == asked


def test_drills_come_from_the_training_episodes_then_from_seeds_after_the_validation_ones():
    recipe = AgentRecipe(episodes=3, eval_tasks=2, drill_episodes=6)
    demos = collect_demonstrations(recipe, range(3))
    assert [t.seed for t in drill_conversations(recipe, demos)] == [0, 1, 2, 5, 6, 7]
    assert drill_conversations(recipe.model_copy(update={"drill_episodes": 3}), demos) == demos


def test_drill_steps_come_first_then_every_nth_step():
    assert [is_drill_step(s, 3, 4) for s in range(11)] == [True] * 3 + [False, False, False, True] * 2
    assert not any(is_drill_step(s, 0, 0) for s in range(10))
    assert [is_drill_step(s, 2, 0) for s in range(5)] == [True, True, False, False, False]


class _NextId(torch.nn.Module):
    """A "model" whose argmax after token t is t + 1."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None):
        return type("Out", (), {"logits": torch.nn.functional.one_hot((input_ids + 1) % 20, 20).float()})


def test_untied_embeddings_give_the_output_layer_its_own_weights():
    tied = tiny_qwen3(tiny_qwen3_config(30, hidden_size=16, num_hidden_layers=1))
    untied = tiny_qwen3(tiny_qwen3_config(30, hidden_size=16, num_hidden_layers=1, tie_word_embeddings=False))
    assert tied.lm_head.weight is tied.get_input_embeddings().weight
    assert untied.lm_head.weight is not untied.get_input_embeddings().weight
    assert count_parameters(untied) - count_parameters(tied) == 30 * 16


def test_exact_final_turns_judges_only_the_last_assistant_turn():
    examples = [([1, 2, 3, 4, 5], [0, 0, 1, 1, 1]),  # 3, 4, 5 follow 2, 3, 4: exact
                ([1, 2, 3, 9], [0, 1, 0, 1]),  # 9 after 3: wrong
                ([1, 7, 3, 4], [0, 1, 0, 1])]  # the earlier turn (7) is wrong, the last (4) right
    assert [final_turn_start(mask) for _, mask in examples] == [2, 3, 3]
    assert exact_final_turns(_NextId(), examples, pad_id=0, batch_size=2) == pytest.approx(2 / 3)


def test_id_read_drills_end_with_a_read_of_ids(demos):
    drills = [d for t in demos for d in copy_drills(t)]
    reads = id_read_drills(drills, KINDS)
    names = {c.function.name for d in reads for c in d.messages[-1].tool_calls}
    assert names == {"get_user_details", "get_reservation_details"}
    searches = [d for d in drills if d.messages[-1].tool_calls and d.messages[-1].tool_calls[0].function.name == "search_direct_flight"]
    assert searches and not any(d in reads for d in searches)


def test_said_value_drills_end_with_a_text_saying_a_value_read_in_a_tool_result():
    demo = next(t for t in collect_demonstrations(AgentRecipe(policy="oracle"), range(40))
                if any(m.role == "assistant" and CHANGE in (m.content or "") for m in t.messages))
    said = said_value_drills(copy_drills(demo))
    assert said and all(not d.messages[-1].tool_calls and d.messages[-1].content for d in said)
    assert any(CHANGE in d.messages[-1].content for d in said)
    kinds = drill_kinds(copy_drills(demo), KINDS)
    assert kinds.count("said value") == len(said) and "id read" in kinds and "update_reservation_flights" in kinds


@pytest.mark.parametrize(("checks", "extra_max", "steps", "checked_at"), [
    ([0.1, 0.4, 0.9], 1000, 2 + 100 + 1, [2, 52, 102]),  # drills on until the check passes
    ([0.0] * 9, 70, 2 + 70 + 1, [2, 52, 72]),  # or until drill_extra_max
    ([0.0], 0, 2 + 1, [2]),
    ([(0.9, 0.1), (0.9, 0.5), (0.95, 0.9)], 1000, 2 + 100 + 1, [2, 52, 102]),  # every gate must pass
])
def test_drills_go_on_until_the_drill_check_passes(checks, extra_max, steps, checked_at):
    model = tiny_qwen3(tiny_qwen3_config(30, hidden_size=16, num_hidden_layers=1))
    example = ([1, 2, 3, 4], [0, 0, 1, 1])
    recipe = AgentRecipe(max_steps=1, drill_steps=2, drill_every=0, drill_target=0.8, drill_extra_max=extra_max,
                         drill_batch_size=1, batch_size=1, warmup_steps=1)
    answers = iter(checks)

    def drill_check(_):
        check = next(answers)
        reads, answered = check if isinstance(check, tuple) else (check, 1.0)
        return {"id_reads_exact": reads, "answered_values_exact": answered, "said_values_exact": 0.0}  # the last only watched

    history = train_sft(model, [example], recipe, 0, drills=[example], log=lambda _: None, drill_check=drill_check)
    assert history["steps"] == steps == len(history["losses"])
    assert [c["step"] for c in history["drill_checks"]] == checked_at


def test_the_code_agents_recipe_reaches_the_code_domain_through_its_teacher():
    from pathlib import Path

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "configs" / "tiny-code-agent.json")
    teacher = recipe.teacher()
    assert teacher.domain == "code" and teacher.seeds("test", 1) == [1_000_000]
    assert teacher.tool_kinds() == {"bash": "write", "search_dir": "read", "str_replace_editor": "write", "submit": "write"}
