"""Continuous batching: the same records as lockstep `act`, rows joining and leaving, seeds, adapters."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from tracerl.envs.runner import Episode, rollout
from tracerl.models.continuous import ContinuousSampler, PolicyTurns, supports_continuous
from tracerl.models.generation import GenerationRequest, generate
from tracerl.models.local import LocalPolicy, load_model


def teacher_forced(model, prompt, tokens):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[len(prompt) - 1 + k, t].item() for k, t in enumerate(tokens)]


def assert_same_records(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.tokens.ids == y.tokens.ids and x.tokens.mask == y.tokens.mask
        assert x.tokens.logprobs == pytest.approx(y.tokens.logprobs, abs=1e-5)
        assert x.messages == y.messages and x.reward == y.reward and x.termination == y.termination


def drain(sampler):
    out = {}
    while sampler.busy:
        out.update(sampler.step())
    return out


def test_rows_join_mid_flight_and_match_one_at_a_time(model):
    prefix = list(range(40, 80))  # shared by two first turns: computed once, copied into their slots
    prompts = {"a": prefix + [5, 6], "b": prefix + [7], "c": [9, 10, 11, 12, 13, 14, 15], "d": [20, 21]}
    sampler = ContinuousSampler(model, max_rows=3)
    sampler.add("a", GenerationRequest(prompts["a"], max_new_tokens=6, temperature=0))
    sampler.add("b", GenerationRequest(prompts["b"], max_new_tokens=3, temperature=0))
    out = dict(sampler.step())  # a prefill and one decode: two tokens each
    assert out == {} and list(sampler.prefixes) == [None]
    sampler.add("c", GenerationRequest(prompts["c"], max_new_tokens=6, temperature=0))  # joins a running batch
    out = dict(sampler.step())
    assert list(out) == ["b"] and out["b"].finish_reason == "length"
    sampler.release("b")  # c moves into b's slot
    assert [r.key for r in sampler.by_slot] == ["a", "c"]
    sampler.add("d", GenerationRequest(prompts["d"], max_new_tokens=5, temperature=0))
    out.update(drain(sampler))
    for key, prompt in prompts.items():
        budget = {"a": 6, "b": 3, "c": 6, "d": 5}[key]
        alone = generate(model, [GenerationRequest(prompt, max_new_tokens=budget, temperature=0)])[0]
        assert out[key].token_ids == alone.token_ids
        assert out[key].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
        assert out[key].logprobs == pytest.approx(teacher_forced(model, prompt, alone.token_ids), abs=1e-5)


def test_next_turn_reuses_the_slot_and_grows_the_cache(model):
    sampler = ContinuousSampler(model, max_rows=2)
    first = list(range(3, 303))  # longer than the first capacity (256): the cache grows
    sampler.add(0, GenerationRequest(first, max_new_tokens=4, temperature=0))
    turn1 = drain(sampler)[0]
    assert sampler.cache.capacity >= 304
    second = first + turn1.token_ids + [7, 8, 9]  # the environment's answer and a new header
    sampler.add(0, GenerationRequest(second, max_new_tokens=5, temperature=0))
    turn2 = drain(sampler)[0]
    assert sampler.rows[0].cached == second + turn2.token_ids[:-1]
    assert turn2.logprobs == pytest.approx(teacher_forced(model, second, turn2.token_ids), abs=1e-5)
    alone = generate(model, [GenerationRequest(second, max_new_tokens=5, temperature=0)])[0]
    assert turn2.token_ids == alone.token_ids


def test_sampled_rows_follow_their_own_generators(model):
    def request(seed, prompt):
        return GenerationRequest(prompt, max_new_tokens=8, temperature=0.8, top_p=0.9, stop_ids=[3],
                                 generator=torch.Generator().manual_seed(seed))

    prompts = [[5, 6, 7], [9, 10, 11, 12], [20, 21, 22, 23, 24]]
    sampler = ContinuousSampler(model, max_rows=3, logprobs_mode="processed_logprobs")
    for k, p in enumerate(prompts):
        sampler.add(k, request(k, p))
    out = drain(sampler)
    for k, p in enumerate(prompts):
        alone = generate(model, [request(k, p)], logprobs_mode="processed_logprobs")[0]
        assert out[k].token_ids == alone.token_ids and out[k].finish_reason == alone.finish_reason
        assert out[k].logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_store_episodes_equal_lockstep_greedy_and_sampled(toy, tokenizer, model):
    def run(engine, temperature, batch_size, seed=3):
        policy = LocalPolicy(model, tokenizer, temperature=temperature, max_new_tokens=16, seed=seed, engine=engine)
        return rollout(toy.StoreEnv, policy, [Episode(seed=s) for s in (0, 1, 1, 2, 4)], batch_size=batch_size)

    for temperature in (0.0, 1.0):
        lockstep = run("lockstep", temperature, 5)
        assert max(t.num_turns for t in lockstep) >= 2
        for batch_size in (1, 2, 5):  # episodes join as others end: the same records
            assert_same_records(run("continuous", temperature, batch_size), lockstep)
    a, b = run("continuous", 1.0, 2, seed=5), run("continuous", 1.0, 2, seed=6)
    assert [t.tokens.ids for t in a] != [t.tokens.ids for t in b]


def test_tiny_agent_airline_greedy_records_equal_lockstep():
    from tracerl.envs.airline.env import AirlineEnv

    model, tokenizer = load_model("tiny-agent", device="cpu")
    episodes = [Episode(seed=1_000_003 + k) for k in range(3)]

    def run(engine, batch_size):
        policy = LocalPolicy(model, tokenizer, temperature=0.0, max_new_tokens=96, engine=engine)
        return rollout(lambda: AirlineEnv(split="test", max_turns=8), policy, episodes, batch_size=batch_size)

    lockstep = run("lockstep", 3)
    assert sum(t.num_turns for t in lockstep) >= 6
    assert_same_records(run("continuous", 2), lockstep)


def test_mixed_lora_adapters_and_peft_model_in_training(toy, tokenizer, tmp_path):
    def lora(seed, name):
        torch.manual_seed(seed)
        peft = get_peft_model(toy.make_model(tokenizer), LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                                    target_modules=["q_proj", "v_proj", "up_proj"]))
        peft.save_pretrained(tmp_path / name)
        return tmp_path / name

    episodes = [Episode(seed=1, adapter="a"), Episode(seed=1), Episode(seed=2, adapter="b"), Episode(seed=0, adapter="a")]

    def run(engine):
        policy = LocalPolicy(toy.make_model(tokenizer), tokenizer, temperature=1.0, max_new_tokens=10, seed=1, engine=engine)
        policy.load_adapter("a", lora(1, "a"))
        policy.load_adapter("b", lora(2, "b"))
        policy.model.train()
        trajs = rollout(toy.StoreEnv, policy, episodes, batch_size=3)
        assert policy.model.training  # mode restored after sampling
        return trajs

    continuous = run("continuous")
    assert_same_records(continuous, run("lockstep"))
    assert continuous[0].tokens.logprobs != pytest.approx(continuous[1].tokens.logprobs, abs=1e-3)


def test_context_overflow_and_eager_attention(toy, tokenizer):
    from tracerl.core.messages import Message
    from tracerl.core.policy import Session

    small = toy.make_model(tokenizer, max_positions=64)
    small.set_attn_implementation("eager")
    assert supports_continuous(small)
    policy = LocalPolicy(small, tokenizer, max_new_tokens=8)
    turns = policy.turns(4)
    s = Session(messages=[Message.system(toy.SYSTEM * 4), Message.user("Hi")], tools=[])
    turns.submit(0, s)
    assert turns.step() == [(0, Message.assistant(content=""))] and s.info["context_overflow"] is True

    def run(engine):
        p = LocalPolicy(toy.make_model(tokenizer), tokenizer, temperature=1.0, max_new_tokens=12, seed=2, engine=engine)
        p.model.set_attn_implementation("eager")
        return rollout(toy.StoreEnv, p, [Episode(seed=s) for s in range(3)], batch_size=2)

    assert_same_records(run("continuous"), run("lockstep"))


def test_lockstep_where_continuous_does_not_apply(toy, tokenizer, model):
    assert isinstance(LocalPolicy(model, tokenizer).turns(8), PolicyTurns)
    assert LocalPolicy(model, tokenizer, engine="lockstep").turns(8) is None

    class OwnAct(LocalPolicy):
        def act(self, sessions):
            return super().act(sessions)

    assert OwnAct(model, tokenizer).turns(8) is None
    assert LocalPolicy(model, tokenizer, max_batch_size=3).turns(8).max_rows == 3
    windowed = toy.make_model(tokenizer)
    windowed.config.layer_types = ["full_attention", "sliding_attention"]  # one 4D mask cannot serve both
    assert not supports_continuous(windowed) and LocalPolicy(windowed, tokenizer).turns(8) is None
    windowed.config.layer_types = ["full_attention", "full_attention"]
    assert supports_continuous(windowed)


@pytest.mark.parametrize("mode, moe_routing", [("moe", "opening"), ("moe", "token"), ("router", None)])
def test_composed_model_records_equal_lockstep(toy, tokenizer, tmp_path, mode, moe_routing):
    from tracerl.models.composed.adapters import load_adapter
    from tracerl.models.composed.composition import compose
    from tracerl.models.composed.policy import ComposedPolicy
    from tracerl.contracts import Capability
    from tracerl.core.messages import Message

    dirs = []
    for seed, name in ((1, "alpha"), (2, "beta")):
        torch.manual_seed(seed)
        peft = get_peft_model(toy.make_model(tokenizer), LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                                    target_modules=["q_proj", "v_proj", "up_proj"]))
        peft.save_pretrained(tmp_path / name)
        dirs.append(tmp_path / name)
    caps = [Capability(name="alpha", description="store items"), Capability(name="beta", description="look things up")]
    openings = ["Thanks, bye.", "Please go on.", "I will look it up.", "Please set the price of A1 to 12.", "Done."]

    class Openings(toy.StoreEnv):  # openings the random gates send to different slots
        def _setup(self, seed, options):
            box, opening, info = super()._setup(seed, options)
            return box, [opening[0], Message.user(openings[seed])], info

    episodes = [Episode(seed=s) for s in range(5)]

    def run(engine):
        model = toy.make_model(tokenizer)
        composition = compose(model, [load_adapter(d) for d in dirs], caps, mode=mode, gate_init_std=1.0, seed=1,
                              tokenizer=tokenizer, moe_routing=moe_routing or "token")
        policy = ComposedPolicy(composition.composed_model, tokenizer, temperature=1.0, max_new_tokens=10, seed=1,
                                engine=engine)
        assert (policy.turns(8) is not None) == (engine == "continuous")
        return rollout(Openings, policy, episodes, batch_size=3)

    continuous = run("continuous")
    assert_same_records(continuous, run("lockstep"))
    if mode == "router" or moe_routing == "opening":  # routed once per episode, the slot kept in its record
        slots = {max(t.info["routing"], key=t.info["routing"].get) for t in continuous}
        assert len(slots) >= 2 or mode == "router"  # one running batch mixes episodes routed apart


@pytest.mark.slow
def test_a_token_budget_bounds_the_cache_with_the_same_tokens():
    """`kv_cache_tokens`: the tiny agent's airline episodes, greedy and sampled, give the records of the
    unbounded cache while the cache holds at most the budget — turns wait, and idle episodes' caches are
    dropped and recomputed, when it is full."""
    from tracerl.core.errors import InputError
    from tracerl.envs.airline.env import AirlineEnv

    model, tokenizer = load_model("tiny-agent", device="cpu")
    episodes = [Episode(seed=1_000_003 + k) for k in range(6)]

    def run(temperature, budget):
        policy = LocalPolicy(model, tokenizer, temperature=temperature, max_new_tokens=64, seed=7, kv_cache_tokens=budget)
        made = []
        make = policy.turns
        policy.turns = lambda rows: made.append(make(rows)) or made[-1]
        trajectories = rollout(lambda: AirlineEnv(split="test", max_turns=6), policy, episodes, batch_size=4)
        (sampler,) = made[0].samplers.values()
        return trajectories, sampler

    for temperature in (0.0, 1.0):
        unbounded, plain = run(temperature, None)
        longest = max(len(t.tokens.ids) for t in unbounded)
        budget = longest + 64 + 16  # one turn of the longest episode fits, not four episodes
        bounded, paged = run(temperature, budget)
        assert_same_records(bounded, unbounded)
        assert paged.cache.peak_blocks * paged.cache.block <= budget
        assert paged.peak_allocated_tokens <= budget + paged.cache.block  # the pool and its scratch block
        assert plain.peak_allocated_tokens >= 4 * longest  # every slot the capacity of the longest
        assert paged.peak_allocated_tokens < plain.peak_allocated_tokens / 2
        assert paged.held_back > 0 and paged.dropped > 0  # turns waited, caches were dropped and recomputed
    with pytest.raises(InputError, match="kv_cache_tokens"):
        run(0.0, 64)  # less than the first turn needs
