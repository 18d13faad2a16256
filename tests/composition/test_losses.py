"""Gate objectives and routing statistics against hand-computed values."""

import math

import pytest
import torch

from tracerl.composition.losses import expert_load, label_loss, load_balancing_loss, routing_entropy

# one sequence, three tokens, three slots; the third token is masked out
LOGITS = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 9.0]]])
MASK = torch.tensor([[1, 1, 0]])


def softmax(row):
    exps = [math.exp(v) for v in row]
    return [e / sum(exps) for e in exps]


P1, P2 = softmax([2, 0, 0]), softmax([0, 1, 0])  # (0.78699, 0.10650, 0.10650), (0.21194, 0.57612, 0.21194)


def test_load_balancing_loss_switch_form():
    fraction = [0.5, 0.5, 0.0]  # token 1 → slot 0, token 2 → slot 1
    mean_prob = [(P1[i] + P2[i]) / 2 for i in range(3)]
    expected = 3 * sum(f * p for f, p in zip(fraction, mean_prob))
    assert expected == pytest.approx(1.261164, abs=1e-6)
    assert load_balancing_loss(LOGITS, MASK).item() == pytest.approx(expected, abs=1e-6)


def test_load_balancing_loss_extremes():
    uniform = torch.zeros(1, 4, 3)
    assert load_balancing_loss(uniform, torch.ones(1, 4)).item() == pytest.approx(1.0 * 3 * (1 / 3), abs=1e-6)
    collapsed = torch.tensor([[[50.0, 0.0, 0.0]] * 4])
    assert load_balancing_loss(collapsed, torch.ones(1, 4)).item() == pytest.approx(3.0, abs=1e-6)


def test_label_loss_is_token_cross_entropy_toward_the_sequence_slot():
    expected = (-math.log(P1[1]) - math.log(P2[1])) / 2
    assert expected == pytest.approx(1.395495, abs=1e-6)
    assert label_loss(LOGITS, torch.tensor([1]), MASK).item() == pytest.approx(expected, abs=1e-6)


def test_routing_entropy_and_expert_load():
    entropy = lambda p: -sum(x * math.log(x) for x in p)  # noqa: E731
    assert routing_entropy(LOGITS, MASK).item() == pytest.approx((entropy(P1) + entropy(P2)) / 2, abs=1e-6)
    assert expert_load(LOGITS, MASK).tolist() == [0.5, 0.5, 0.0]


def test_empty_mask_is_an_error():
    with pytest.raises(ValueError, match="no tokens"):
        load_balancing_loss(LOGITS, torch.zeros(1, 3))
