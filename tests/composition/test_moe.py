"""Token-level MoE: equality with PEFT, per-token routing, frozen parameters, gate parameter count."""

from __future__ import annotations

import copy

import pytest
import torch
from composition_helpers import make_adapter, tiny_model
from peft import PeftModel

from tracerl.models.composed.adapters import load_adapter
from tracerl.models.composed.composition import compose, gate_parameter_count
from tracerl.models.composed.composition import prompt_slot
from tracerl.models.composed.examples import GateExample
from tracerl.models.composed.layers import GatedLoRALinear
from tracerl.composition.training import GateTrainingConfig, train_gates
from tracerl.models.generation import _forward_signature


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tiny_model(seed=0)
    root = tmp_path_factory.mktemp("adapters")
    dirs = [make_adapter(base, root / "alpha", seed=1), make_adapter(base, root / "beta", seed=2, r=2, alpha=3.0, targets=["q_proj", "down_proj"])]
    return base, dirs


@pytest.fixture(params=["dense", "gather"])
def strategy(request, monkeypatch):
    """Both ways of applying the experts must give the same results."""
    monkeypatch.setattr(GatedLoRALinear, "strategy", request.param)
    return request.param


def peft_of(base, path):
    return PeftModel.from_pretrained(copy.deepcopy(base), str(path)).eval()


def test_single_expert_forced_equals_peft_model(setup, strategy):
    base, dirs = setup
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(dirs[0])])
    reference = peft_of(base, dirs[0])
    ids = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(ids).logits
        with composition.routing(force_slots=1):
            got = model(ids).logits
        assert (expected - base(ids).logits).abs().max() > 1e-2  # the adapter does change the outputs
        assert torch.allclose(got, expected, atol=1e-5, rtol=0)
        assert torch.equal(model(ids).logits, base(ids).logits)  # outside a routed call: the base model
        # KV cache: prefill 5 tokens, then decode one at a time (each call routed on its own) — same logits
        cache_name, _ = _forward_signature(model)  # "cache" in recent transformers
        with composition.routing(force_slots=1):
            out = model(ids[:, :5], use_cache=True)
        cache, steps = getattr(out, cache_name), [out.logits]
        for t in range(5, 9):
            with composition.routing(force_slots=1):
                out = model(ids[:, t : t + 1], use_cache=True, **{cache_name: cache})
            cache = getattr(out, cache_name)
            steps.append(out.logits)
        assert torch.allclose(torch.cat(steps, dim=1), expected, atol=1e-5, rtol=0)


def test_single_expert_gate_weights_forced_equals_peft_model(setup):
    """Forcing through the gate itself (bias toward slot 1), not the override."""
    base, dirs = setup
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(dirs[0])])
    with torch.no_grad():
        for gate in composition.gates:
            gate.bias.copy_(torch.tensor([0.0, 5.0]))
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), composition.routing() as call:
        assert torch.allclose(model(ids).logits, peft_of(base, dirs[0])(ids).logits, atol=1e-5, rtol=0)
    assert len(call.slots) == 2 and all((s == 1).all() for s in call.slots)
    with torch.no_grad():  # the composed model routes every call itself
        assert torch.allclose(composition.composed_model(ids).logits, peft_of(base, dirs[0])(ids).logits, atol=1e-5, rtol=0)


def test_untrained_gates_route_every_token_to_the_base(setup):
    base, dirs = setup
    model = copy.deepcopy(base)
    composed = compose(model, [load_adapter(d) for d in dirs]).composed_model
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(composed(ids).logits, base(ids).logits)


def test_two_halves_of_one_sequence_route_to_different_experts(setup, strategy):
    base, dirs = setup
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(d) for d in dirs])
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        with composition.routing(force_slots=torch.tensor([[1, 1, 1, 1, 2, 2, 2, 2]])):
            mixed = model(ids).logits
        with composition.routing(force_slots=1):
            only_alpha = model(ids).logits
        with composition.routing(force_slots=2):
            only_beta = model(ids).logits
    # causal: the first half saw only expert-1 tokens, so it equals the alpha adapter's PEFT model
    assert torch.allclose(mixed[:, :4], peft_of(base, dirs[0])(ids).logits[:, :4], atol=1e-5, rtol=0)
    assert torch.allclose(only_beta, peft_of(base, dirs[1])(ids).logits, atol=1e-5, rtol=0)
    assert (mixed[:, 4:] - only_alpha[:, 4:]).abs().max() > 1e-3
    assert (mixed[:, 4:] - only_beta[:, 4:]).abs().max() > 1e-3


def test_real_gate_routes_each_token_by_its_hidden_state(setup, strategy):
    """Layer 0's gate reads each token's embedding: tokens on either side of a hyperplane pick
    different experts inside one sequence, and each token's q_proj output is base + its expert's update."""
    base, dirs = setup
    model = copy.deepcopy(base)
    adapters = [load_adapter(d) for d in dirs]
    composition = compose(model, adapters)
    direction = torch.randn(32, generator=torch.Generator().manual_seed(4))
    side = model.model.embed_tokens.weight.detach() @ direction
    ids = torch.cat([torch.nonzero(side > 0)[:4, 0], torch.nonzero(side < 0)[:4, 0]]).unsqueeze(0)
    with torch.no_grad():
        composition.gates[0].weight.zero_()
        composition.gates[0].weight[1] = 100 * direction
        composition.gates[0].weight[2] = -100 * direction
    seen = {}
    q_proj = model.model.layers[0].self_attn.q_proj
    q_proj.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out))
    with torch.no_grad(), composition.routing() as call:
        model(ids)
    assert call.slots[0].tolist() == [[1, 1, 1, 1, 2, 2, 2, 2]]
    x = seen["x"][0]
    name = "model.layers.0.self_attn.q_proj"
    for t, slot in enumerate([1, 1, 1, 1, 2, 2, 2, 2]):
        lora = adapters[slot - 1].modules[name]
        expected = q_proj.base.weight @ x[t] + lora.scaling * (lora.B @ (lora.A @ x[t]))
        assert (lora.B @ (lora.A @ x[t])).abs().max() > 1e-3
        assert torch.allclose(seen["y"][0, t], expected, atol=1e-5, rtol=0)


def test_gate_parameter_count_formula(setup):
    assert gate_parameter_count(48, 2048, 5) == 491_760  # Qwen3-30B-A3B-like dims, 4 capabilities
    assert gate_parameter_count(2, 32, 3) == 2 * (32 * 3 + 3)
    base, dirs = setup
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(d) for d in dirs])
    assert composition.gate_parameter_count() == gate_parameter_count(2, 32, 3) == 198
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == 198


def test_frozen_parameters_stay_bit_identical_through_gate_training(setup):
    base, dirs = setup
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(d) for d in dirs], gate_init_std=0.02)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not n.startswith("tracerl_gates")}
    assert any(n.endswith(".lora_A") for n in frozen)  # the experts are among the checked tensors
    gates_before = [g.weight.detach().clone() for g in composition.gates]
    gen = torch.Generator().manual_seed(5)
    examples = [
        GateExample(ids.tolist(), [0, 0] + [1] * 6, [1] * 8, slot)
        for slot in (1, 2, 1, 2)
        for ids in [torch.randint(0, 64, (8,), generator=gen)]
    ]
    history = train_gates(composition, examples, GateTrainingConfig(max_steps=4, per_device_train_batch_size=2, logging_steps=2))
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
            assert not p.requires_grad
    assert any(not torch.equal(g.weight, b) for g, b in zip(composition.gates, gates_before))
    assert [h["step"] for h in history] == [2, 4]
    record = history[-1]
    assert set(record) >= {"loss", "lm_loss", "load_balancing_loss", "label_loss", "routing_entropy", "expert_load"}
    assert len(record["expert_load"]) == 3 and abs(sum(record["expert_load"]) - 1) < 1e-6


def test_assert_frozen_catches_a_trainable_base_parameter(setup):
    base, dirs = setup
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(dirs[0])])
    model.model.layers[0].mlp.down_proj.lora_B.requires_grad_(True)
    with pytest.raises(RuntimeError, match="trainable"):
        composition.assert_frozen()


def test_gate_training_learns_the_label(setup):
    """Label loss alone separates two kinds of sequences: held-in token accuracy rises above chance."""
    base, dirs = setup
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(d) for d in dirs], gate_init_std=0.02)
    examples = [GateExample([5, 6, 7, 8, 9, 10], [0] * 6, [1] * 6, 1), GateExample([40, 41, 42, 43, 44, 45], [0] * 6, [1] * 6, 2)]
    config = GateTrainingConfig(max_steps=60, per_device_train_batch_size=2, learning_rate=0.05, lm_loss_coef=0.0, logging_steps=10)
    history = train_gates(composition, examples, config)
    assert history[-1]["label_loss"] < 0.5 * history[0]["label_loss"]
    assert history[-1]["token_routing_accuracy"] > 0.9  # chance: 1/3


def test_the_lm_loss_reaches_no_gate_through_a_labelled_token(setup):
    """In training, the chosen expert is scaled by its gate probability (the LM loss's only way to
    the gate); on labelled tokens that scale is detached, so only the label loss trains their gates."""
    base, dirs = setup
    composition = compose(copy.deepcopy(base), [load_adapter(d) for d in dirs], gate_init_std=0.02)
    ids = torch.tensor([[3, 9, 27, 17, 51, 30]])

    def gate_grad(labelled: torch.Tensor | None) -> float:
        composition.gates.zero_grad()
        composition.gates.train()
        with composition.routing(labelled=labelled):
            composition.model(input_ids=ids).logits.pow(2).mean().backward()
        return sum(float(g.weight.grad.abs().sum()) for g in composition.gates if g.weight.grad is not None)

    assert gate_grad(None) > 0
    assert gate_grad(torch.zeros(1, 6, dtype=torch.bool)) > 0
    assert gate_grad(torch.ones(1, 6, dtype=torch.bool)) == 0


@pytest.mark.parametrize(("schedule", "last_rate"), [("linear", 0.0), ("constant", 0.05)])
def test_gate_learning_rate_follows_the_schedule(setup, schedule, last_rate):
    base, dirs = setup
    composition = compose(copy.deepcopy(base), [load_adapter(d) for d in dirs])
    examples = [GateExample([5, 6, 7, 8], [0] * 4, [1] * 4, 1), GateExample([40, 41, 42, 43], [0] * 4, [1] * 4, 2)]
    config = GateTrainingConfig(max_steps=4, per_device_train_batch_size=2, learning_rate=0.05, lr_scheduler_type=schedule,
                                lm_loss_coef=0.0, logging_steps=2)
    history = train_gates(composition, examples, config)
    assert [h["learning_rate"] for h in history] == pytest.approx([0.025 if schedule == "linear" else 0.05, last_rate])


def test_prompt_slot_is_the_majority_of_each_tokens_majority_over_layers():
    votes = torch.tensor([  # (layers, tokens); the first layer sends every token to slot 1
        [1, 1, 1, 1],
        [1, 1, 2, 1],
        [2, 1, 1, 2],
        [2, 1, 2, 2],
    ])
    # per token: 2 (2:2 tie, the deepest layer chose 2), 1, 2 (tie), 2 (tie) -> slot 2;
    # pooling the 16 decisions would give slot 1 (9 votes against 7)
    assert prompt_slot(votes) == 2
    assert prompt_slot(torch.tensor([[3, 3, 3], [1, 1, 2], [1, 1, 2]])) == 1  # tokens 1, 1, 2
    assert prompt_slot(torch.tensor([[2, 1], [2, 1]])) == 1  # a tie between tokens goes to the lower slot
    assert prompt_slot(torch.zeros(4, 0, dtype=torch.long)) == 0
