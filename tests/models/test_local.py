"""LocalPolicy: the whole chat/tool-call path on a tiny random Qwen3, exact records, PEFT adapters by name."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tracerl.core.errors import InputError
from tracerl.core.messages import Message
from tracerl.core.policy import Policy, Session
from tracerl.envs.runner import Episode, rollout
from tracerl.models.local import LocalPolicy, load_model


def teacher_forced_logprobs(model, ids, **kwargs):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), **kwargs).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [0.0] + [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]


def save_lora(toy, tokenizer, path, seed):
    torch.manual_seed(seed)
    peft_model = get_peft_model(toy.make_model(tokenizer), LoraConfig(
        r=4, lora_alpha=8, init_lora_weights=False,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    peft_model.save_pretrained(path)
    return path


def test_rollout_records_are_exact(toy, tokenizer, model):
    policy = LocalPolicy(model, tokenizer, temperature=1.0, max_new_tokens=24, seed=3)
    assert isinstance(policy, Policy)
    trajs = rollout(toy.StoreEnv, policy, [Episode(seed=s) for s in range(4)], batch_size=4)
    assert len(trajs) == 4
    for t in trajs:
        rec = t.tokens
        assert rec is not None and len(rec.ids) == len(rec.mask) == len(rec.logprobs)
        assert rec.mask[: rec.prompt_len] == [0] * rec.prompt_len and sum(rec.mask) > 0
        # log-probs on mask-1 tokens are the model's own, recomputed by one plain forward
        forced = teacher_forced_logprobs(model, rec.ids)
        for i, m in enumerate(rec.mask):
            if m:
                assert rec.logprobs[i] == pytest.approx(forced[i], abs=1e-4)
            else:
                assert rec.logprobs[i] == 0.0
        # each assistant message is the parse of its sampled tokens
        spans, start = [], None
        for i, m in enumerate(rec.mask + [0]):
            if m and start is None:
                start = i
            if not m and start is not None:
                spans.append(rec.ids[start:i])
                start = None
        assistant = [m for m in t.messages if m.role == "assistant"]
        assert len(spans) == len(assistant)


def test_same_seed_same_episodes_and_greedy_is_deterministic(toy, tokenizer, model):
    def run(seed, temperature=1.0):
        policy = LocalPolicy(model, tokenizer, temperature=temperature, max_new_tokens=16, seed=seed)
        return [t.tokens.ids for t in rollout(toy.StoreEnv, policy, [Episode(seed=0)] * 3)]

    a, b, c = run(5), run(5), run(6)
    assert a == b and a != c
    assert len({tuple(x) for x in a}) == 3  # sessions of one group sample differently
    g = run(1, temperature=0.0)
    assert g[0] == g[1] == g[2]


def test_lora_adapters_by_name_in_mixed_batches(toy, tokenizer, tmp_path):
    a_dir = save_lora(toy, tokenizer, tmp_path / "a", seed=1)
    b_dir = save_lora(toy, tokenizer, tmp_path / "b", seed=2)
    policy = LocalPolicy(toy.make_model(tokenizer), tokenizer, temperature=0.0, max_new_tokens=10)
    policy.load_adapter("a", a_dir)
    policy.load_adapter("b", b_dir)
    assert policy.adapters == ["a", "b"]

    def session(adapter):
        env = toy.StoreEnv()
        messages, info = env.reset(seed=1)
        return Session(messages=messages, tools=env.tools, info=info, adapter=adapter)

    mixed = [session("a"), session(None), session("b")]
    policy.act(mixed)
    alone = {name: session(name) for name in ("a", None, "b")}
    for s in alone.values():
        policy.act([s])
    for s in mixed:
        assert s.tokens.ids == alone[s.adapter].tokens.ids
        assert s.tokens.logprobs == pytest.approx(alone[s.adapter].tokens.logprobs, abs=1e-5)
    assert mixed[0].tokens.logprobs != pytest.approx(mixed[1].tokens.logprobs, abs=1e-3)
    # base rows are the plain model's
    base = LocalPolicy(toy.make_model(tokenizer), tokenizer, temperature=0.0, max_new_tokens=10)
    plain = session(None)
    base.act([plain])
    assert plain.tokens.logprobs == pytest.approx(mixed[1].tokens.logprobs, abs=1e-5)
    # adapter rows match the adapter loaded alone through PeftModel.from_pretrained
    model_a, _ = load_model(a_dir_with_base(a_dir, tmp_path, toy, tokenizer), device="cpu")
    forced = teacher_forced_logprobs(model_a, mixed[0].tokens.ids)
    rec = mixed[0].tokens
    assert [lp for lp, m in zip(rec.logprobs, rec.mask) if m] == pytest.approx([f for f, m in zip(forced, rec.mask) if m], abs=1e-4)
    # replacing and unloading
    policy.unload_adapter("b")
    assert policy.adapters == ["a"]
    with pytest.raises(InputError, match="unknown adapter 'b'"):
        policy.act([session("b")])
    policy.unload_adapter("a")
    assert policy.adapters == []


def a_dir_with_base(adapter_dir, tmp_path, toy, tokenizer):
    """Point the adapter at a saved copy of its base model (as a user's adapter directory would)."""
    import json

    base_dir = tmp_path / "base"
    toy.make_model(tokenizer).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    config_path = adapter_dir / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = str(base_dir)
    config_path.write_text(json.dumps(config))
    return adapter_dir


def test_a_policy_of_an_adapter_directory_plays_the_adapter(toy, tokenizer, tmp_path):
    from peft import PeftModel

    a_dir = a_dir_with_base(save_lora(toy, tokenizer, tmp_path / "a", seed=1), tmp_path, toy, tokenizer)
    model, loaded_tokenizer = load_model(a_dir, device="cpu")
    policy = LocalPolicy(model, loaded_tokenizer, temperature=0.0, max_new_tokens=8)
    session = Session(messages=[Message.user("Please set the price of A1 to 12.")], tools=[])  # no adapter named
    policy.act([session])
    rec = session.tokens
    adapted = PeftModel.from_pretrained(toy.make_model(tokenizer), a_dir)
    played = [lp for lp, m in zip(rec.logprobs, rec.mask) if m]
    assert played == pytest.approx([f for f, m in zip(teacher_forced_logprobs(adapted, rec.ids), rec.mask) if m], abs=1e-4)
    base = teacher_forced_logprobs(toy.make_model(tokenizer), rec.ids)
    assert played != pytest.approx([f for f, m in zip(base, rec.mask) if m], abs=1e-3)


def test_set_adapter_weights_in_place(toy, tokenizer, tmp_path):
    from peft import get_peft_model_state_dict

    a_dir = save_lora(toy, tokenizer, tmp_path / "a", seed=1)
    b_dir = save_lora(toy, tokenizer, tmp_path / "b", seed=2)
    policy = LocalPolicy(toy.make_model(tokenizer), tokenizer, temperature=0.0, max_new_tokens=6)
    policy.load_adapter("a", a_dir)
    policy.load_adapter("b", b_dir)
    before = Session(messages=[Message.user("Please set the price of A1 to 12.")], tools=[], adapter="b")
    policy.act([before])
    policy.set_adapter_weights("a", get_peft_model_state_dict(policy.model, adapter_name="b"))
    after = Session(messages=[Message.user("Please set the price of A1 to 12.")], tools=[], adapter="a")
    policy.act([after])
    assert after.tokens.logprobs == pytest.approx(before.tokens.logprobs, abs=1e-5)


def test_sampling_from_a_peft_model_being_trained(toy, tokenizer):
    peft_model = get_peft_model(toy.make_model(tokenizer), LoraConfig(r=2, target_modules=["q_proj"]), adapter_name="cap")
    peft_model.train()
    policy = LocalPolicy(peft_model, tokenizer, temperature=1.0, max_new_tokens=4)
    s = Session(messages=[Message.user("Hi")], tools=[], adapter="cap")
    policy.act([s])
    assert peft_model.training  # mode restored after sampling
    assert sum(s.tokens.mask) >= 1


def test_context_overflow_gives_an_empty_reply(toy, tokenizer):
    small = toy.make_model(tokenizer, max_positions=64)
    policy = LocalPolicy(small, tokenizer, max_new_tokens=8)
    s = Session(messages=[Message.system(toy.SYSTEM * 4), Message.user("Hi")], tools=[])
    [reply] = policy.act([s])
    assert reply == Message.assistant(content="") and s.info["context_overflow"] is True


def test_load_model_errors_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="cannot load a causal LM"):
        load_model(tmp_path / "nothing-here", device="cpu")


def test_kv_reuse_across_turns_changes_nothing(toy, tokenizer, model):
    def run(kv_reuse):
        policy = LocalPolicy(model, tokenizer, temperature=1.0, max_new_tokens=12, seed=4, kv_reuse=kv_reuse)
        return rollout(toy.StoreEnv, policy, [Episode(seed=s) for s in (0, 1, 1, 2)], batch_size=4)

    with_reuse, without = run(True), run(False)
    assert max(t.num_turns for t in with_reuse) >= 2
    for a, b in zip(with_reuse, without):
        assert a.tokens.ids == b.tokens.ids and a.tokens.mask == b.tokens.mask
        assert a.tokens.logprobs == pytest.approx(b.tokens.logprobs, abs=1e-5)


def test_reused_kv_is_dropped_when_adapters_change(toy, tokenizer, tmp_path):
    policy = LocalPolicy(toy.make_model(tokenizer), tokenizer, temperature=0.0, max_new_tokens=6)
    s = Session(messages=[Message.user("Hi")], tools=[])
    s.messages.append(policy.act([s])[0])
    assert s.state.extra["kv"][0] == 0
    policy.load_adapter("a", save_lora(toy, tokenizer, tmp_path / "a", seed=1))
    s.messages.append(Message.user("Go on."))
    request = policy._request(s, policy.chat.prepare(s), 6)
    assert request.past is None  # stale: computed with other weights


class RoutedPolicy(LocalPolicy):
    """PEFT's per-row routing (`adapter_names`) for every batch: the reference for the plain forward."""

    def _adapter_kwargs(self):
        from tracerl.models.local import BASE

        return lambda extras: {"adapter_names": [e if e is not None else BASE for e in extras]}


def test_rows_all_on_the_active_adapter_skip_peft_routing(toy, tokenizer, tmp_path):
    """A batch whose rows all use the active adapter runs PEFT's plain forward (no per-row routing):
    the same episodes, token for token and log-prob for log-prob, as with routing; other batches route."""
    a_dir = save_lora(toy, tokenizer, tmp_path / "a", seed=1)
    b_dir = save_lora(toy, tokenizer, tmp_path / "b", seed=2)
    played = {}
    for cls in (LocalPolicy, RoutedPolicy):
        policy = cls(toy.make_model(tokenizer), tokenizer, temperature=1.0, max_new_tokens=24, seed=4)
        policy.load_adapter("a", a_dir)
        policy.load_adapter("b", b_dir)
        for engine in ("continuous", "lockstep"):
            policy.engine = engine
            played[cls, engine] = rollout(toy.StoreEnv, policy, [Episode(seed=s % 3, adapter="a") for s in range(6)],
                                          batch_size=6)
    kwargs = LocalPolicy(toy.make_model(tokenizer), tokenizer)
    kwargs.load_adapter("a", a_dir)
    kwargs.load_adapter("b", b_dir)
    route = kwargs._adapter_kwargs()
    assert route(["a", "a"]) == {}  # "a" is active (loaded first)
    assert route(["b", "b"]) == {"adapter_names": ["b", "b"]} and route(["a", None])["adapter_names"][1] == "__base__"
    for engine in ("continuous", "lockstep"):
        for fast, routed in zip(played[LocalPolicy, engine], played[RoutedPolicy, engine], strict=True):
            assert fast.tokens.ids == routed.tokens.ids and fast.tokens.mask == routed.tokens.mask
            assert fast.tokens.logprobs == pytest.approx(routed.tokens.logprobs, abs=1e-6)
    assert sum(sum(t.tokens.mask) for t in played[LocalPolicy, "continuous"]) > 6 * 10
