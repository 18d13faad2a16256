"""Batched episodes are the episodes played alone: the tiny agent on airline, one at a time
(lockstep, batch 1) vs the continuous batch, greedy and sampled."""

import pytest

from tracerl.envs.airline.env import AirlineEnv
from tracerl.envs.runner import Episode, rollout
from tracerl.models.local import LocalPolicy, load_model


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tiny_agent_episodes_alone_equal_batched(temperature):
    model, tokenizer = load_model("tiny-agent", device="cpu")
    episodes = [Episode(seed=1_000_003 + k // 4) for k in range(8)]  # two groups of 4 episodes of one task

    def run(engine, batch_size):
        policy = LocalPolicy(model, tokenizer, temperature=temperature, max_new_tokens=160, seed=0, engine=engine)
        return rollout(lambda: AirlineEnv(split="test", max_turns=6), policy, episodes, batch_size=batch_size)

    alone, batched = run("lockstep", 1), run("continuous", 8)
    assert sum(sum(t.tokens.mask) for t in alone) >= 600
    for a, b in zip(alone, batched, strict=True):
        assert a.tokens.ids == b.tokens.ids and a.tokens.mask == b.tokens.mask and a.messages == b.messages
        assert a.tokens.logprobs == pytest.approx(b.tokens.logprobs, abs=1e-4)
