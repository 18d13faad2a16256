"""Advantages, ratios, masks and the three loss normalisations against hand-computed values."""

import math

import pytest
import torch

from tracerl.training.advantages import group_advantages, informative_groups
from tracerl.training.loss import BatchCounts, policy_loss, token_logprobs
from tracerl.training.sequences import TrainSequence, collate

L = math.log


def test_group_advantages_hand_values():
    # group [1,0,0,1]: mean .5, unbiased std sqrt(4·.25/3) = 0.577350; A = ±.5 / (0.577350 + 1e-4)
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.2, 0.2, 0.2]]), "group")
    a = 0.5 / (0.5773502692 + 1e-4)
    assert adv[0].tolist() == pytest.approx([a, -a, -a, a], abs=1e-9)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_batch_and_none_scaling_hand_values():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    # batch std of [1,0,0,0]: mean .25, var (.5625 + 3·.0625)/3 = .25, std .5
    assert group_advantages(rewards, "batch").flatten().tolist() == pytest.approx(
        [0.5 / 0.5001, -0.5 / 0.5001, 0, 0], abs=1e-9)
    assert group_advantages(rewards, "none").flatten().tolist() == pytest.approx([0.5, -0.5, 0, 0])
    with pytest.raises(ValueError):
        group_advantages(rewards, "whatever")


def test_informative_groups():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.5, 0.0]])
    assert informative_groups(r).tolist() == [False, False, True]


def _tables():
    logp = torch.tensor([[0, L(0.5), L(0.2)], [0, L(0.9), 0]])
    old = torch.tensor([[0, L(0.25), L(0.2)], [0, L(0.5), 0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.float32)
    adv = torch.tensor([1.0, -1.0])
    return logp, old, mask, adv


# per-token losses: seq0 ratios 2 (clipped to 1.28, A=+1) → −1.28 and 1 → −1; seq1 ratio 1.8 (A=−1) → +1.8
@pytest.mark.parametrize("loss_type,expected", [
    ("grpo", ((-1.28 - 1) / 2 + 1.8) / 2),   # 0.33
    ("dapo", (-1.28 - 1 + 1.8) / 3),         # −0.16
    ("dr_grpo", (-1.28 - 1 + 1.8) / (2 * 4)),  # −0.06 with max_completion_length 4
])
def test_loss_types_hand_values(loss_type, expected):
    logp, old, mask, adv = _tables()
    loss, stats = policy_loss(logp, old, adv, mask, BatchCounts(2, 3), loss_type=loss_type,
                              epsilon=0.2, epsilon_high=0.28, max_completion_length=4)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["tokens"].item() == 3
    assert stats["clipped"].item() == 1  # only the ratio-2 token with A > 0
    # k3: (ρ − 1 − ln ρ) summed over masked tokens: ρ = 2, 1, 1.8
    assert stats["approx_kl"].item() == pytest.approx((1 - L(2)) + 0 + (0.8 - L(1.8)), abs=1e-6)


def test_real_ratio_moves_the_loss():
    """The importance ratio is not identically 1: old log-probs enter the loss."""
    logp, old, mask, adv = _tables()
    on_policy, _ = policy_loss(logp, logp, adv, mask, BatchCounts(2, 3))
    off_policy, _ = policy_loss(logp, old, adv, mask, BatchCounts(2, 3))
    assert on_policy.item() == pytest.approx(((-1 - 1) / 2 + 1) / 2)  # ratio 1 everywhere: −A per token
    assert off_policy.item() != pytest.approx(on_policy.item())


def test_kl_to_base_hand_value():
    logp, old, mask, adv = _tables()
    ref = torch.tensor([[0, L(0.25), L(0.4)], [0, L(0.9), 0]])
    # k3(ref − logp): ln .5 → .5 + ln 2 − 1 = .193147; ln 2 → 2 − ln 2 − 1 = .306853; 0 → 0
    loss, stats = policy_loss(logp, old, adv, mask, BatchCounts(2, 3), beta=0.1, ref_logp=ref)
    seq0 = (-1.28 + 0.1 * 0.1931472 - 1 + 0.1 * 0.3068528) / 2
    assert loss.item() == pytest.approx((seq0 + 1.8) / 2, abs=1e-6)
    assert stats["kl"].item() == pytest.approx(0.5, abs=1e-6)
    with pytest.raises(ValueError):
        policy_loss(logp, old, adv, mask, BatchCounts(2, 3), beta=0.1)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_micro_batch_shares_sum_to_full_batch_loss(loss_type):
    logp, old, mask, adv = _tables()
    counts = BatchCounts(2, 3)
    full, _ = policy_loss(logp, old, adv, mask, counts, loss_type=loss_type)
    parts = sum(policy_loss(logp[i:i + 1], old[i:i + 1], adv[i:i + 1], mask[i:i + 1], counts, loss_type=loss_type)[0]
                for i in range(2))
    assert parts.item() == pytest.approx(full.item(), abs=1e-7)


def test_masked_tokens_take_no_gradient():
    logp = torch.tensor([[0.0, -1.0, -2.0, -0.5]], requires_grad=True)
    mask = torch.tensor([[0, 1, 0, 1]], dtype=torch.float32)
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0]), mask, BatchCounts(1, 2))
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 2] == 0
    assert logp.grad[0, 1] != 0 and logp.grad[0, 3] != 0


def test_token_logprobs_alignment_and_padding(tiny_model):
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (1, 6))
    logp, ent = token_logprobs(tiny_model, ids, torch.ones_like(ids), temperature=0.7)
    logits = tiny_model(input_ids=ids).logits[0].float() / 0.7
    for t in range(1, 6):  # the log-prob of ids[t] comes from the logits at t − 1
        assert logp[0, t].item() == pytest.approx(torch.log_softmax(logits[t - 1], -1)[ids[0, t]].item(), abs=1e-5)
    assert logp[0, 0] == 0 and ent[0, 0] == 0 and (ent[0, 1:] > 0).all()
    # right padding does not change the log-probs of the real tokens
    seqs = [TrainSequence(ids[0].tolist(), [0.0] * 6, [1] * 6, 1.0), TrainSequence(ids[0, :3].tolist(), [0.0] * 3, [1] * 3, 1.0)]
    batch = collate(seqs)
    padded, _ = token_logprobs(tiny_model, batch.ids, batch.attention_mask, temperature=0.7)
    assert padded[0].tolist() == pytest.approx(logp[0].tolist(), abs=1e-5)
    assert padded[1, :3].tolist() == pytest.approx(logp[0, :3].tolist(), abs=1e-5)
    assert batch.loss_mask[1].tolist() == [1, 1, 1, 0, 0, 0]


def test_shared_prefix_gives_the_same_logprobs_and_gradients(tiny_model):
    from peft import LoraConfig, get_peft_model

    from tracerl.training.loss import shared_prefix_length

    torch.manual_seed(1)
    model = get_peft_model(tiny_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # a non-zero adapter, so LoRA gradients flow everywhere
    prompt = torch.randint(0, 60, (7,)).tolist()
    seqs = [TrainSequence(prompt + torch.randint(0, 60, (k,)).tolist(), [0.0] * (7 + k), [0] * 7 + [1] * k, a)
            for k, a in ((5, 1.0), (3, -1.0), (6, 0.5))]
    batch = collate(seqs)
    p = shared_prefix_length(batch.ids, batch.attention_mask, batch.loss_mask)
    assert p == 7

    def run(prefix_len):
        model.zero_grad()
        logp, ent = token_logprobs(model, batch.ids, batch.attention_mask, 0.9, prefix_len=prefix_len)
        loss, _ = policy_loss(logp, logp.detach() - 0.1, batch.advantages, batch.loss_mask, BatchCounts(3, 14))
        loss.backward()
        grads = torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None])
        return logp * batch.loss_mask, ent * batch.loss_mask, loss, grads

    plain, shared = run(0), run(p)
    for a, b in zip(plain, shared):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    # a scored token inside the would-be prefix stops it there
    mask = batch.loss_mask.clone()
    mask[1, 4] = 1
    assert shared_prefix_length(batch.ids, batch.attention_mask, mask) == 4
