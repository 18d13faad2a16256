"""Task-level router (α from label-token probabilities) and the weighted merge W' = W + Σ α·scaling·B A."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from composition_helpers import two_adapters
from peft import PeftModel
from safetensors.torch import load_file

from tracerl.models.composed.adapters import load_adapter
from tracerl.models.composed.composition import compose, top1_weights, top_p_weights
from tracerl.contracts import Capability
from tracerl.models.composed.merge import merge_adapters
from tracerl.models.composed.router import TaskRouter, route_names
from tracerl.core.errors import InputError
from tracerl.core.messages import Message
from tracerl.models.generation import _forward_signature

CAPS = [Capability(name="alpha", description="cancels reservations"), Capability(name="beta", description="looks up orders")]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return two_adapters(tmp_path_factory)


def conversation(text):
    return [Message.system("You are an agent."), Message.user(text)]


def test_router_alpha_is_the_renormalised_label_probability(setup):
    base, tokenizer, _ = setup
    router = TaskRouter(base, tokenizer, CAPS)
    assert router.labels == ["A", "B", "C"]
    requests = ["cancel my reservation please", "look up the order status of order 7 now"]
    alpha = router.alphas([conversation(r) for r in requests])
    label_ids = [tokenizer.encode(x, add_special_tokens=False)[0] for x in ("C", "A", "B")]  # slot order: base, alpha, beta
    for row, request in enumerate(requests):
        ids = torch.tensor([router.prompt_ids(request)])
        with torch.no_grad():
            probs = base(ids).logits[0, -1].double().softmax(-1)
        picked = [float(probs[i]) for i in label_ids]
        expected = [p / sum(picked) for p in picked]
        assert alpha[row].tolist() == pytest.approx(expected, abs=1e-6)
    prompt = router.messages(requests[0])[1]["content"]
    assert "A: alpha — cancels reservations" in prompt and "C: the general assistant" in prompt and requests[0] in prompt


def test_fitted_label_head_starts_at_the_zero_shot_router_and_learns_the_labels(setup):
    base, tokenizer, _ = setup
    router = TaskRouter(base, tokenizer, CAPS)
    requests = ["cancel my reservation please", "cancel reservation 12 now", "look up the order status", "look up order 9"]
    zero_shot = router.label_logits(requests)
    weight, bias = router.head()
    assert torch.equal(weight, base.lm_head.weight[router.label_ids_by_slot]) and not bias.any()
    summary = router.fit(requests, [1, 1, 2, 2], steps=100, learning_rate=0.05)
    assert router.kind == "label-head" and summary["train_accuracy"] == 1.0
    assert summary["train_accuracy_zero_shot"] == float((zero_shot.argmax(-1) == torch.tensor([1, 1, 2, 2])).float().mean())
    assert router.alphas([conversation(r) for r in requests]).argmax(-1).tolist() == [1, 1, 2, 2]


def test_top1_and_top_p_weights_by_hand():
    alpha = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.3, 0.2]])
    assert top1_weights(alpha).tolist() == [[0, 1, 0], [1, 0, 0]]
    assert torch.allclose(top_p_weights(alpha, 0.8), torch.tensor([[0, 2 / 3, 1 / 3], [0.625, 0.375, 0]]))
    assert torch.allclose(top_p_weights(alpha, 0.5), torch.tensor([[0.0, 1, 0], [1, 0, 0]]))
    assert route_names(alpha, ["base", "alpha", "beta"]) == ["alpha", None]


def test_router_mode_serves_the_chosen_adapter_per_sequence(setup):
    base, tokenizer, dirs = setup
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(d) for d in dirs], CAPS, mode="router", tokenizer=tokenizer)
    composed = composition.composed_model
    weights = composition.weights_for([conversation("cancel my reservation please")])
    assert weights.sum().item() == 1 and weights.max().item() == 1
    slot = int(weights.argmax())
    ids = torch.randint(0, len(tokenizer), (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = composed(ids, routing_weights=weights).logits
        expected = base(ids).logits if slot == 0 else PeftModel.from_pretrained(copy.deepcopy(base), str(dirs[slot - 1])).eval()(ids).logits
        # a batch mixing two routes
        both = composed(ids.repeat(2, 1), routing_weights=torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])).logits
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    for row, d in enumerate(dirs):
        reference = PeftModel.from_pretrained(copy.deepcopy(base), str(d)).eval()
        with torch.no_grad():
            assert torch.allclose(both[row], reference(ids).logits[0], atol=1e-5, rtol=0)


def test_merge_equals_w_plus_weighted_sum_of_scaled_lora_products_exactly(setup):
    base, _, dirs = setup
    alpha = [0.7, 0.3]
    merged = merge_adapters(copy.deepcopy(base), [load_adapter(d) for d in dirs], alpha)
    # the hand computation reads the PEFT files directly
    deltas = {}
    for weight, d in zip(alpha, dirs):
        config = json.loads((d / "adapter_config.json").read_text())
        scaling = config["lora_alpha"] / config["r"]
        state = load_file(str(d / "adapter_model.safetensors"))
        for key in state:
            if key.endswith(".lora_A.weight"):
                module = key[len("base_model.model."):-len(".lora_A.weight")]
                B = state[key.replace("lora_A", "lora_B")].double()
                delta = (weight * scaling) * (B @ state[key].double())
                deltas[module] = deltas[module] + delta if module in deltas else delta
    assert "model.layers.0.self_attn.k_proj" in deltas and "model.layers.1.mlp.down_proj" in deltas
    originals = dict(base.named_parameters())
    for name, p in merged.named_parameters():
        module = name[: -len(".weight")]
        if module in deltas:
            assert torch.equal(p, (originals[name].double() + deltas[module]).to(p.dtype)), name
        else:
            assert torch.equal(p, originals[name]), name


def test_merged_weights_match_the_low_rank_merge_mode(setup):
    base, tokenizer, dirs = setup
    adapters = [load_adapter(d) for d in dirs]
    merged = merge_adapters(copy.deepcopy(base), adapters, [0.7, 0.3])
    model = copy.deepcopy(base)
    composition = compose(model, adapters, CAPS, mode="merge", tokenizer=tokenizer)
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), composition.routing(torch.tensor([[0.0, 0.7, 0.3]])):
        assert torch.allclose(model(ids).logits, merged(ids).logits, atol=1e-5, rtol=0)


def test_per_call_weights_follow_the_rows_through_the_kv_cache(setup):
    """Each call carries the weights of its rows: after a finished row is dropped from the KV cache (the
    cache's own `batch_select_indices`), the next call passes the remaining rows' weights, and the result
    equals running those rows alone. A router/merge call without weights is refused."""
    from tracerl.models.chat import ChatFormat

    base, tokenizer, dirs = setup
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(d) for d in dirs], CAPS, mode="merge", tokenizer=tokenizer, top_p=1.0)
    composed = composition.composed_model
    chat = ChatFormat(tokenizer)
    conversations = [conversation("cancel my reservation please"), conversation("look up the order status"), conversation("hello")]
    weights = composition.weights_for(conversations)
    assert not torch.allclose(weights[0], weights[1])
    prompts = [chat.prompt_ids(c, None) for c in conversations]
    assert torch.equal(composition.weights_for_prompt_ids(prompts), weights)  # the first user turn, read from the ids
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    attention = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    step = torch.tensor([[5], [6], [7]])
    keep = torch.tensor([0, 2])
    grown = torch.cat([attention[keep], torch.ones(2, 1, dtype=torch.long)], 1)
    with torch.no_grad():
        cache_name, _ = _forward_signature(model)  # "cache" in recent transformers
        cache = getattr(composed(input_ids=ids, attention_mask=attention, use_cache=True, routing_weights=weights), cache_name)
        cache.batch_select_indices(keep)  # row 1 finished
        nxt = composed(input_ids=step[keep], attention_mask=grown, use_cache=True, routing_weights=weights[keep],
                       **{cache_name: cache}).logits
        alone = composed(input_ids=ids[keep], attention_mask=attention[keep], use_cache=True, routing_weights=weights[keep])
        expected = composed(input_ids=step[keep], attention_mask=grown, use_cache=True, routing_weights=weights[keep],
                            **{cache_name: getattr(alone, cache_name)}).logits
        assert torch.allclose(nxt, expected, atol=1e-5, rtol=0)
        with pytest.raises(InputError, match="routing_weights"):
            composed(input_ids=ids, attention_mask=attention)
        with pytest.raises(RuntimeError, match="2 rows but the batch has 3"):
            composed(input_ids=ids, attention_mask=attention, routing_weights=weights[keep])
        # generate() without weights routes each row from its prompt, as if given them
        routed = composed.generate(ids, attention_mask=attention, max_new_tokens=4, do_sample=False, pad_token_id=0)
        given = composed.generate(ids, attention_mask=attention, max_new_tokens=4, do_sample=False, pad_token_id=0,
                                  routing_weights=weights)
    assert torch.equal(routed, given)


def test_composed_policy_routes_server_requests_from_their_prompt_ids(setup):
    """Requests that arrive without weights (the OpenAI server's) are routed from their prompts, also
    when the batched sampler prefills a long shared system prompt once; rows finish at different times."""
    from tracerl.models.composed.policy import ComposedPolicy
    from tracerl.models.chat import ChatFormat
    from tracerl.models.generation import GenerationRequest, generate

    base, tokenizer, dirs = setup
    model = copy.deepcopy(base)
    composition = compose(model, [load_adapter(d) for d in dirs], CAPS, mode="merge", tokenizer=tokenizer, top_p=1.0)
    policy = ComposedPolicy(model, tokenizer, temperature=0.0)
    chat = ChatFormat(tokenizer)
    system = "You are a support agent for an airline. Follow the policy strictly and verify every precondition. " * 2
    conversations = [[Message.system(system), Message.user(t)] for t in ("cancel my reservation please", "look up the order status", "hello")]
    requests = [GenerationRequest(prompt_ids=chat.prompt_ids(c, None), max_new_tokens=n, temperature=0.0, extra="served-name")
                for c, n in zip(conversations, (2, 6, 4))]
    results = policy.generate_requests(requests)
    weights = composition.weights_for(conversations)
    for request, w, result in zip(requests, weights, results):
        assert request.extra == pytest.approx(tuple(w.tolist()))
        alone = generate(composition.composed_model, [GenerationRequest(prompt_ids=request.prompt_ids, max_new_tokens=request.max_new_tokens, temperature=0.0)],
                         forward_kwargs=lambda extras, w=w: {"routing_weights": w[None]})
        assert alone[0].token_ids == result.token_ids
        assert alone[0].logprobs == pytest.approx(result.logprobs, abs=1e-5)
