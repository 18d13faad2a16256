"""The batched KV-cache sampler against plain full-sequence forwards, hand-computed top-p, seeding."""

import math

import pytest
import torch

from tracerl.models.generation import GenerationRequest, generate, top_p_filter


def teacher_forced(model, prompt, tokens, temperature=1.0):
    logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return [lp[len(prompt) - 1 + k, t].item() for k, t in enumerate(tokens)]


def test_top_p_filter_by_hand():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    kept = top_p_filter(logits, 0.8)  # 0.5 + 0.3 reaches 0.8: the rest go
    assert torch.isfinite(kept).tolist() == [True, True, False, False]
    assert torch.isfinite(top_p_filter(logits, 0.81)).tolist() == [True, True, True, False]
    assert torch.isfinite(top_p_filter(logits, 0.01)).tolist() == [True, False, False, False]
    assert torch.softmax(top_p_filter(logits, 0.8), -1)[0].item() == pytest.approx(0.5 / 0.8)


def test_batched_greedy_equals_one_at_a_time_and_teacher_forcing(model):
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24]]
    batch = generate(model, [GenerationRequest(p, max_new_tokens=6, temperature=0) for p in prompts])
    for prompt, res in zip(prompts, batch):
        alone = generate(model, [GenerationRequest(prompt, max_new_tokens=6, temperature=0)])[0]
        assert res.token_ids == alone.token_ids
        assert res.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
        assert res.logprobs == pytest.approx(teacher_forced(model, prompt, res.token_ids), abs=1e-5)
        assert res.finish_reason == "length" and len(res.token_ids) == 6


def test_logprob_modes_and_seeded_sampling(model):
    prompt = [5, 6, 7, 8]

    def run(seed, mode, t=0.7, top_p=1.0):
        req = GenerationRequest(prompt, max_new_tokens=8, temperature=t, top_p=top_p, generator=torch.Generator().manual_seed(seed))
        return generate(model, [req], logprobs_mode=mode)[0]

    a, b, c = run(1, "raw_logprobs"), run(1, "raw_logprobs"), run(2, "raw_logprobs")
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    assert a.logprobs == pytest.approx(teacher_forced(model, prompt, a.token_ids), abs=1e-5)
    processed = run(1, "processed_logprobs")
    assert processed.token_ids == a.token_ids  # the mode changes what is reported, not what is sampled
    assert processed.logprobs == pytest.approx(teacher_forced(model, prompt, a.token_ids, temperature=0.7), abs=1e-5)
    # with top-p, processed log-probs are of the renormalised nucleus: never below the tempered full ones
    nucleus = run(3, "processed_logprobs", top_p=0.5)
    full = teacher_forced(model, prompt, nucleus.token_ids, temperature=0.7)
    assert all(n >= f - 1e-6 for n, f in zip(nucleus.logprobs, full))


def test_stop_tokens_rows_finish_independently(model):
    greedy = generate(model, [GenerationRequest([5, 6, 7], max_new_tokens=6, temperature=0)])[0]
    stop = greedy.token_ids[2]
    first = greedy.token_ids.index(stop)
    reqs = [GenerationRequest([5, 6, 7], max_new_tokens=6, temperature=0, stop_ids=[stop]),
            GenerationRequest([9, 10], max_new_tokens=6, temperature=0)]
    out = generate(model, reqs)
    assert out[0].token_ids == greedy.token_ids[: first + 1] and out[0].finish_reason == "stop"
    assert out[1].token_ids == generate(model, [reqs[1]])[0].token_ids


def test_top_logprobs_include_the_greedy_token(model):
    res = generate(model, [GenerationRequest([5, 6], max_new_tokens=3, temperature=0, top_logprobs=3)])[0]
    for token, lp, top in zip(res.token_ids, res.logprobs, res.top_logprobs):
        assert top[0] == (token, pytest.approx(lp)) and len(top) == 3
        assert sum(math.exp(v) for _, v in top) <= 1.0 + 1e-6


def test_shared_prompt_prefix_runs_once_and_changes_nothing(model):
    from tracerl.models.generation import shared_prefix_length

    prefix = list(range(40, 80))
    prompts = [prefix + [5, 6], prefix + [7], prefix + [8, 9, 10]]
    assert shared_prefix_length(prompts) == 40 and shared_prefix_length([prefix, prefix]) == 39
    assert shared_prefix_length([[1] * 10, [1] * 10]) == 0  # under the minimum
    batch = generate(model, [GenerationRequest(p, max_new_tokens=5, temperature=0) for p in prompts])
    for prompt, res in zip(prompts, batch):
        assert res.logprobs == pytest.approx(teacher_forced(model, prompt, res.token_ids), abs=1e-5)
