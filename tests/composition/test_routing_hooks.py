"""Routing is per call: no replaced methods on the model or its KV cache, no hook left registered after a
forward or a generate (an exception included), and turn extraction in `tracerl.models.chat`."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from composition_helpers import two_adapters
from torch.nn.modules import module as torch_module

from tracerl.models.composed.adapters import load_adapter
from tracerl.models.composed.composition import compose
from tracerl.contracts import Capability
from tracerl.models.composed.layers import GatedLoRALinear
from tracerl.models.composed.policy import ComposedPolicy
from tracerl.core.errors import InputError
from tracerl.core.messages import Message
from tracerl.models.chat import ChatFormat, first_user_turn
from tracerl.models.generation import GenerationRequest, _forward_signature

CAPS = [Capability(name="alpha", description="cancels reservations"), Capability(name="beta", description="looks up orders")]
CACHE_METHODS = ("batch_select_indices", "batch_repeat_interleave", "update", "get_seq_length", "reorder_cache", "crop")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base, tokenizer, dirs = two_adapters(tmp_path_factory)
    return base, tokenizer, [load_adapter(d) for d in dirs]


def composed_of(setup, mode):
    base, tokenizer, adapters = setup
    model = copy.deepcopy(base)
    composition = compose(model, adapters, CAPS, mode=mode, gate_init_std=1.0, tokenizer=tokenizer)
    return model, composition


def hooks(model) -> list[str]:
    """Every module (by name) with a forward hook or pre-hook registered, and any global one."""
    held = [name for name, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks]
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        held.append("<global>")
    return held


def assert_unpatched(model, composition, cache=None) -> None:
    for m in (model, composition.composed_model):
        assert "forward" not in vars(m) and "generate" not in vars(m)
        assert m.forward.__func__ is type(m).forward and m.generate.__func__ is type(m).generate
    for layer in composition.layers:
        assert layer.forward.__func__ is type(layer).forward
    assert hooks(model) == [] and hooks(composition.composed_model) == []
    if cache is not None:
        assert not [name for name in vars(cache) if name in CACHE_METHODS or name.startswith("tracerl")]
        for name in CACHE_METHODS:
            if hasattr(type(cache), name):
                assert getattr(cache, name).__func__ is inspect.getattr_static(type(cache), name)


@pytest.mark.parametrize("mode", ["moe", "router", "merge"])
def test_a_forward_and_a_generate_leave_the_model_and_its_cache_unpatched(setup, mode):
    _, tokenizer, _ = setup
    model, composition = composed_of(setup, mode)
    assert_unpatched(model, composition)
    composed = composition.composed_model
    ids = torch.randint(0, len(tokenizer), (2, 6), generator=torch.Generator().manual_seed(0))
    weights = None if mode == "moe" else torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    cache_name, _ = _forward_signature(composed)
    with torch.no_grad():
        with composition.routing(weights):  # hooks exist during the call: one per layer and per gated linear
            linears = sum(isinstance(m, GatedLoRALinear) for m in model.modules())
            assert len(hooks(model)) == len(composition.layers) + linears > 2
            model(ids)
        assert_unpatched(model, composition)
        out = composed(ids, use_cache=True, routing_weights=weights)
        cache = getattr(out, cache_name)
        cache_class = {name: inspect.getattr_static(type(cache), name) for name in CACHE_METHODS if hasattr(type(cache), name)}
        cache.batch_select_indices(torch.tensor([1]))
        composed(ids[1:, :1], use_cache=True, routing_weights=None if weights is None else weights[1:], **{cache_name: cache})
        assert_unpatched(model, composition, cache)
        composed.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0, routing_weights=weights)
        assert_unpatched(model, composition)
    # the batched sampler: a shared-prefix prefill whose cache is repeated per row, rows finishing apart
    chat = ChatFormat(tokenizer)
    policy = ComposedPolicy(model, tokenizer, temperature=0.0)
    prompts = [chat.prompt_ids([Message.system("You are an agent."), Message.user(t)], None) for t in ("cancel it", "order status")]
    policy.generate_requests([GenerationRequest(prompt_ids=p, max_new_tokens=n, temperature=0.0) for p, n in zip(prompts, (2, 4))])
    assert_unpatched(model, composition)
    assert {name: inspect.getattr_static(type(cache), name) for name in cache_class} == cache_class


@pytest.mark.parametrize("mode", ["moe", "merge"])
def test_a_forward_that_raises_inside_a_hook_still_removes_every_hook(setup, mode):
    _, tokenizer, _ = setup
    model, composition = composed_of(setup, mode)
    ids = torch.randint(0, len(tokenizer), (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if mode == "moe":  # forced slots of the wrong shape: the first gated linear's weights do not fit
            with pytest.raises(RuntimeError, match="do not match the layer input"):
                with composition.routing(force_slots=torch.ones(3, 6, dtype=torch.long)):
                    model(ids)
        else:  # three rows of weights for a batch of two: the first decoder layer's pre-hook raises
            with pytest.raises(RuntimeError, match="3 rows but the batch has 2"):
                composition.composed_model(ids, routing_weights=torch.tensor([[0.0, 1.0, 0.0]] * 3))
    assert_unpatched(model, composition)
    with pytest.raises(ValueError, match="raised in the block"), composition.routing(
            None if mode == "moe" else torch.tensor([[1.0, 0.0, 0.0]])):
        raise ValueError("raised in the block")
    assert hooks(model) == []


def test_explicit_routing_arguments_are_checked(setup):
    model, composition = composed_of(setup, "merge")
    moe_model, moe = composed_of(setup, "moe")
    with pytest.raises(InputError, match=r"routing_weights must be \(batch, 3\)"), composition.routing(torch.ones(2, 2)):
        pass
    with pytest.raises(InputError, match="force_slots and record act on the gates"), composition.routing(torch.ones(1, 3), force_slots=1):
        pass
    with pytest.raises(InputError, match="routed per token takes no routing_weights"), moe.routing(torch.ones(1, 3)):
        pass
    assert hooks(model) == [] and hooks(moe_model) == []


def test_outside_a_routed_call_the_composed_model_is_the_base(setup):
    base, tokenizer, _ = setup
    model, composition = composed_of(setup, "moe")
    ids = torch.randint(0, len(tokenizer), (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        routed = composition.composed_model(ids).logits
        assert not torch.allclose(routed, base(ids).logits, atol=1e-3)  # random gates pick adapters
        assert torch.equal(model(ids).logits, base(ids).logits)


def test_first_user_turn_of_a_conversation_and_of_a_rendered_prompt(setup):
    _, tokenizer, _ = setup
    conversation = [Message.system("be brief"), Message.user("cancel order 7\nnow"), Message.assistant("ok"), Message.user("thanks")]
    assert first_user_turn(conversation) == "cancel order 7\nnow"
    assert first_user_turn([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]) == "hi"
    assert first_user_turn([Message.system("s")]) is None
    rendered = ChatFormat(tokenizer).render(conversation, None, add_generation_prompt=True)
    assert first_user_turn(rendered) == "cancel order 7\nnow"
    assert first_user_turn("<|im_start|>system\ns<|im_end|>\n<|im_start|>user\ncancel ord") is None  # cut before the turn ends
