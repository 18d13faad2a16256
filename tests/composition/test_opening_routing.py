"""moe routed at the opening: the gates' per-token majority over an episode's opening — the decision
routing accuracy counts — picks one slot, and every token of the episode takes it."""

from __future__ import annotations

import copy

import pytest
import torch
from composition_helpers import two_adapters

from tracerl.models.composed.composition import LabelledPrompt, predicted_slots
from tracerl.models.composed.adapters import load_adapter
from tracerl.models.composed.composition import compose
from tracerl.models.composed.examples import opening_example_from_ids, prompt_example
from tracerl.models.composed.policy import ComposedPolicy
from tracerl.contracts import Capability
from tracerl.core.errors import InputError
from tracerl.core.messages import Message
from tracerl.core.policy import Session
from tracerl.models.chat import ChatFormat

CAPS = [Capability(name="alpha", description="cancels reservations"), Capability(name="beta", description="looks up orders")]
REQUESTS = ["cancel my reservation please", "look up the order status", "which specialist should handle this",
            "cancel the order", "status of my reservation", "please look up order 12"]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return two_adapters(tmp_path_factory)


@pytest.fixture(scope="module")
def setup(parts):
    base, tokenizer, dirs = parts
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(d) for d in dirs], CAPS, mode="moe", gate_init_std=1.0, seed=3,
                          moe_routing="opening", tokenizer=tokenizer)
    return model, composition, tokenizer


def conversation(request: str, later_turns: bool) -> list[Message]:
    messages = [Message.system("You are a support agent."), Message.user(request)]
    if later_turns:
        messages += [Message.assistant("Which one?"), Message.user("the first one"), Message.assistant("done"), Message.user("thanks")]
    return messages


def test_each_episode_takes_the_slot_routing_accuracy_counts(setup):
    _, composition, tokenizer = setup
    conversations = [conversation(r, later_turns=i % 2 == 1) for i, r in enumerate(REQUESTS)]
    weights = composition.weights_for(conversations, [[] for _ in conversations])
    slots = predicted_slots(composition, tokenizer, [LabelledPrompt(m, [], "alpha") for m in conversations])
    assert weights.argmax(dim=-1).tolist() == slots and len(set(slots)) >= 2  # the random gates disagree across openings
    assert weights.sum(dim=-1).tolist() == [1.0] * len(conversations) and set(weights.flatten().tolist()) == {0.0, 1.0}
    # later turns do not change an episode's slot: the opening alone decides it
    assert composition.weights_for([conversation(r, later_turns=True) for r in REQUESTS]).equal(
        composition.weights_for([conversation(r, later_turns=False) for r in REQUESTS]))
    # from token ids (a served request), the same decision
    chat = ChatFormat(tokenizer)
    ids = [chat.prompt_ids(m, None) for m in conversations]
    assert composition.weights_for_prompt_ids(ids).equal(weights)


def test_the_opening_of_a_rendered_conversation_is_its_prompt_example(setup):
    _, _, tokenizer = setup
    chat = ChatFormat(tokenizer)
    messages = conversation("cancel my reservation please", later_turns=True)
    from_ids = opening_example_from_ids(tokenizer, chat.prompt_ids(messages, None))
    expected = prompt_example(tokenizer, messages, [], 0)
    assert (from_ids.input_ids, from_ids.label_mask) == (expected.input_ids, expected.label_mask)
    assert 0 < sum(expected.label_mask) < len(expected.label_mask)  # the system prompt takes no vote
    with pytest.raises(InputError, match="whole first user turn"):
        opening_example_from_ids(tokenizer, chat.prompt_ids([Message.system("s")], None))


def test_every_token_takes_the_episode_slot(setup):
    model, composition, tokenizer = setup
    chat = ChatFormat(tokenizer)
    conversations = [conversation(r, later_turns=True) for r in REQUESTS[:2]]
    weights = composition.weights_for(conversations)
    for messages, row in zip(conversations, weights, strict=True):
        ids = torch.tensor([chat.prompt_ids(messages, None)])
        with torch.no_grad():
            held = composition.composed_model(ids, routing_weights=row[None]).logits
            with composition.routing(force_slots=int(row.argmax())):
                forced = model(ids).logits
            with composition.routing():
                per_token = model(ids).logits
        assert torch.allclose(held, forced, atol=1e-6) and not torch.allclose(held, per_token, atol=1e-4)


def test_the_policy_routes_each_session_once_on_its_opening(setup):
    model, composition, tokenizer = setup
    policy = ComposedPolicy(model, tokenizer, max_new_tokens=3, seed=0, temperature=0.0)
    sessions = [Session(messages=conversation(r, later_turns=False), tools=[]) for r in REQUESTS[:4]]
    policy.act(sessions)
    expected = predicted_slots(composition, tokenizer, [LabelledPrompt(s.messages[:2], [], "alpha") for s in sessions])
    assert [max(s.info["routing"], key=s.info["routing"].get) for s in sessions] == [composition.slot_names[k] for k in expected]
    routing = dict(sessions[0].info["routing"])
    sessions[0].messages += [Message.user("and the other one")]
    policy.act(sessions[:1])
    assert sessions[0].info["routing"] == routing


def test_without_weights_the_gates_route_each_token(setup, parts):
    model, composition, _ = setup
    ids = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(0))
    weights = torch.tensor([[0.0, 1.0, 0.0]])
    with pytest.raises(InputError, match="force_slots and record act on the gates"), composition.routing(weights, force_slots=1):
        pass
    with torch.no_grad(), composition.routing() as call:  # without weights the gates route each token
        model(ids)
    assert all(s.shape == (1, 5) for s in call.slots)
    base, _, dirs = parts
    per_token = compose(copy.deepcopy(base), [load_adapter(d) for d in dirs], CAPS)
    assert per_token.weights_for([conversation("cancel it", False)]) is None


def test_the_gates_fitted_to_the_openings_route_held_out_openings(setup):
    """Two capabilities whose requests share every word but one: fitted layer by layer, the gates
    route held-out openings of both right, and the fit draws nothing (two fits, same gates)."""
    from tracerl.composition.opening_fit import fit_gates_to_openings
    from tracerl.composition.training import GateTrainingConfig

    _, composition, tokenizer = setup
    words = {"alpha": "cancel", "beta": "look up"}
    def openings(ks):
        return [LabelledPrompt(conversation(f"please {w} the order {k}", later_turns=False), [], cap)
                for cap, w in words.items() for k in ks]
    train = [prompt_example(tokenizer, p.messages, [], composition.slot_of(p.capability)) for p in openings(range(12))]
    saved = [g.state_dict() for g in composition.gates]
    try:
        first = fit_gates_to_openings(composition, train, GateTrainingConfig(max_steps=50))
        weights = [g.weight.detach().clone() for g in composition.gates]
        assert [r["layer"] for r in first] == [0, 1] and all(r["tokens"] > 0 for r in first)
        # the tokens before the word that differs cannot tell (the model is causal); the majority can
        assert 0.5 < first[-1]["token_routing_accuracy"] < 1.0
        held_out = openings(range(100, 106))
        assert predicted_slots(composition, tokenizer, held_out) == [composition.slot_of(p.capability) for p in held_out]
        again = fit_gates_to_openings(composition, train, GateTrainingConfig(max_steps=50, seed=7))
        assert again == first and all(torch.equal(g.weight, w) for g, w in zip(composition.gates, weights, strict=True))
        with pytest.raises(InputError, match="no openings"):
            fit_gates_to_openings(composition, [], GateTrainingConfig())
    finally:
        for g, state in zip(composition.gates, saved, strict=True):
            g.load_state_dict(state)


def test_a_token_with_a_split_target_is_fitted_to_the_split():
    """Every token wants slots 1 and 2 equally: the fitted gate gives them equal probability and
    (nearly) none to slot 0, and routing to either counts as right."""
    from tracerl.composition.opening_fit import fit_gate

    gate = torch.nn.Linear(8, 3)
    features = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[0.0, 0.5, 0.5]]).expand(40, 3)
    record = fit_gate(gate, features, targets, max_iter=100)
    probabilities = torch.softmax(gate(features), dim=-1).detach()
    assert probabilities[:, 1:].sub(0.5).abs().max() < 0.02 and probabilities[:, 0].max() < 0.04
    assert record["token_routing_accuracy"] == 1.0 and record["tokens"] == 40
    assert record["label_loss"] == pytest.approx(float(torch.log(torch.tensor(2.0))), abs=0.05)  # the split's entropy


def test_target_openings_route_the_target_by_what_its_episodes_lacked(setup):
    """Target requests worded like neither environment's, labelled with the capability their
    failed episodes lacked (one split between both), join the fit: held-out target requests of
    each kind go where their kind's failures point."""
    from tracerl.composition.examples import lacking_example
    from tracerl.composition.opening_fit import fit_gates_to_openings
    from tracerl.composition.training import GateTrainingConfig
    from tracerl.core.trajectory import Trajectory

    _, composition, tokenizer = setup

    def env(cap, word, k):
        return prompt_example(tokenizer, conversation(f"please {word} the order {k}", False), [], composition.slot_of(cap))

    def failed(request, lacked):
        trajectory = Trajectory(task_id=request, domain="target", messages=conversation(request, False))
        return lacking_example(tokenizer, trajectory, [composition.slot_of(c) for c in lacked], composition.num_slots)

    split = failed("change my seat 3", ["alpha", "beta"])
    assert split.target == [0.0, 0.5, 0.5] and split.slot == 1
    assert failed("x", ["beta", "beta"]).target == [0.0, 0.0, 1.0]
    with pytest.raises(InputError, match="no capability it lacked"):
        failed("x", [])
    openings = ([env("alpha", "cancel", k) for k in range(12)] + [env("beta", "look up", k) for k in range(12)]
                + [failed(f"refund ticket {k}", ["beta"]) for k in range(8)]
                + [failed(f"upgrade seat {k}", ["alpha"]) for k in range(8)])
    saved = [g.state_dict() for g in composition.gates]
    try:
        fit_gates_to_openings(composition, openings, GateTrainingConfig(max_steps=50))
        held_out = [LabelledPrompt(conversation(f"refund ticket {k}", False), [], "beta") for k in range(100, 104)]
        held_out += [LabelledPrompt(conversation(f"upgrade seat {k}", False), [], "alpha") for k in range(100, 104)]
        assert predicted_slots(composition, tokenizer, held_out) == [2] * 4 + [1] * 4
    finally:
        for g, state in zip(composition.gates, saved, strict=True):
            g.load_state_dict(state)
