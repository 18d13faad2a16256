import pytest

from tracerl.evaluation.stats import bootstrap_mean, paired_difference, pass_hat_k


def test_pass_hat_k_matches_hand_computation():
    # task A: 4 trials, 3 successes; task B: 4 trials, 1 success
    tasks = [(4, 3), (4, 1)]
    assert pass_hat_k(tasks, 1) == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert pass_hat_k(tasks, 2) == pytest.approx((3 / 6 + 0 / 6) / 2)  # C(3,2)/C(4,2) = 3/6
    assert pass_hat_k(tasks, 4) == 0.0
    assert pass_hat_k([(4, 4)], 4) == 1.0
    with pytest.raises(ValueError):
        pass_hat_k(tasks, 5)


def test_bootstrap_interval_contains_mean_and_is_seeded():
    values = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1]
    a = bootstrap_mean(values, seed=1)
    assert a.mean == pytest.approx(0.7)
    assert a.low < 0.7 < a.high and 0.0 <= a.low and a.high <= 1.0
    assert a == bootstrap_mean(values, seed=1)
    assert bootstrap_mean([0.5] * 20).low == bootstrap_mean([0.5] * 20).high == 0.5


def test_paired_difference_uses_common_tasks_only():
    base = {"a": 0.0, "b": 1.0, "c": 0.0}
    variant = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}
    diff = paired_difference(variant, base, seed=0)
    assert diff.mean == pytest.approx(2 / 3)


def test_wilson_interval_matches_hand_computation():
    from tracerl.evaluation.stats import wilson_interval

    # 8 of 32, z = 1.96: centre (0.25 + 3.8416/64) / (1 + 3.8416/32) = 0.27679,
    # half-width 1.96 / 1.12005 · sqrt(0.25·0.75/32 + 3.8416/4096) = 0.14427
    i = wilson_interval(8, 32, z=1.96)
    assert i.mean == 0.25 and abs(i.low - 0.13252) < 1e-5 and abs(i.high - 0.42107) < 1e-5
    # none and all: the interval stays in [0, 1] and is not empty
    assert wilson_interval(0, 32).low == 0.0 and 0.10 < wilson_interval(0, 32).high < 0.11
    assert wilson_interval(32, 32).high == 1.0 and 0.89 < wilson_interval(32, 32).low < 0.90
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
