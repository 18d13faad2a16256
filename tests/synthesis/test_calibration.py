"""Calibration math against hand-computed groups; the difficulty loop with a scripted base policy."""

import math
from fractions import Fraction

import pytest

from tracerl.contracts import CalibrationBands, CalibrationStats, EnvSpec
from tracerl.core.io import read_json
from tracerl.synthesis.calibration import (
    calibrate, group_stats, judge, pass_at_k, rollout_groups,
)
from tracerl.envs.synthetic.envdir import load_env_dir, load_env_spec, write_env_dir
from tracerl.synthesis.scripted import NoisyOraclePolicy
from tracerl.synthesis.synthesize import calibrate_env_dir


def test_pass_at_k_closed_form():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 − C(2,2)/C(4,2)
    assert pass_at_k(16, 3, 4) == pytest.approx(1 - 715 / 1820)  # 1 − C(13,4)/C(16,4)
    assert pass_at_k(16, 0, 8) == 0.0
    assert pass_at_k(16, 16, 16) == 1.0
    assert pass_at_k(16, 1, 16) == 1.0  # n − c < k: every draw of 16 contains the success
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)  # pass@1 is the success rate
    for n, c, k in [(16, 3, 4), (10, 4, 3), (8, 1, 8), (20, 7, 16)]:  # the product form of the same estimator
        product = 1 - math.prod(1 - k / i for i in range(n - c + 1, n + 1))
        assert pass_at_k(n, c, k) == pytest.approx(product)
    # unbiased, unlike "any of the first k samples": [1, 0, 0, 0] has pass@2 = 1/2, not 1
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_group_stats_by_hand():
    groups = [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.5, 0.5]]
    s = group_stats(groups, ks=(1, 2, 4))
    assert (s.groups, s.group_size) == (4, 2)
    assert s.mean_reward == pytest.approx(0.5)  # 4 / 8
    assert s.success_rate == pytest.approx(3 / 8)
    assert s.reward_std == pytest.approx(math.sqrt(1.5 / 8))  # six deviations of .5, two of 0
    assert s.mean_group_std == pytest.approx(0.5 / 4)  # only [1, 0] varies, std .5
    assert (s.all_success, s.all_zero, s.constant, s.informative) == (0.25, 0.25, 0.75, 0.25)
    assert s.pass_at_k == {"1": pytest.approx(0.375), "2": pytest.approx(0.5)}  # k = 4 > n: left out
    with pytest.raises(ValueError):
        group_stats([[1.0], [1.0, 0.0]])


def test_group_stats_mixed_group_sizes_16():
    # 3 groups of 16 with 0, 4 and 16 successes (other rewards 0.5 / 0)
    groups = [[0.0] * 16, [1.0] * 4 + [0.5] * 12, [1.0] * 16]
    s = group_stats(groups)
    expect_p4 = Fraction(0 + 1, 1) - Fraction(math.comb(12, 4), math.comb(16, 4))
    assert s.pass_at_k["4"] == pytest.approx(float((expect_p4 + 1) / 3))
    assert s.pass_at_k["16"] == pytest.approx(2 / 3)
    assert s.success_rate == pytest.approx(20 / 48)
    assert s.mean_reward == pytest.approx((4 + 6 + 16) / 48)


def _stats(**kw) -> CalibrationStats:
    base = dict(groups=10, group_size=16, mean_reward=0.4, success_rate=0.4, reward_std=0.3, mean_group_std=0.3,
                all_success=0.1, all_zero=0.1, constant=0.2, informative=0.8, pass_at_k={})
    return CalibrationStats(**{**base, **kw})


def test_judge_bands_and_direction():
    bands = CalibrationBands()
    assert judge(_stats(), bands) == (True, [], 0)
    ok, reasons, direction = judge(_stats(success_rate=0.8, mean_reward=0.85, all_success=0.5), bands)
    assert not ok and direction == 1 and "success rate 0.800 outside [0.2, 0.6]" in reasons
    ok, reasons, direction = judge(_stats(success_rate=0.05, mean_reward=0.1, all_zero=0.6), bands)
    assert not ok and direction == -1 and "all-zero groups 0.60 > 0.2" in reasons
    ok, reasons, direction = judge(_stats(constant=0.7, informative=0.3), bands)
    assert not ok and direction == 0
    assert judge(_stats(success_rate=0.7), CalibrationBands(success_rate=(0.1, 0.9)))[0]  # configurable


def test_rollout_groups_are_groups_of_one_seed(retail):
    from tracerl.envs.synthetic.templates.multi_step import MultiStepCompletionEnv

    groups = rollout_groups(lambda: MultiStepCompletionEnv(retail, difficulty=0), NoisyOraclePolicy(1.0), [3, 4], 3)
    assert groups == [[1.0] * 3, [1.0] * 3]
    groups = rollout_groups(lambda: MultiStepCompletionEnv(retail, difficulty=0), NoisyOraclePolicy(0.0), [3], 2)
    # one of two requests tried with a wrong value, then stopped: 0.5 × ½ tried, none done, halved for the unasked write
    assert groups == [[0.125, 0.125]]


@pytest.mark.slow
def test_difficulty_loop_moves_into_the_band(retail, tmp_path):
    # the scripted policy gets each of the 2 + d gold calls right with p = 0.8: success .64 at d = 0, .51 at
    # d = 1, .41 at d = 2; a wrong call still earns the half for trying its request, so the mean reward is
    # above the band's .6 at d = 0 and 1 (too easy) and d = 2 is the first difficulty in the band
    spec = EnvSpec(capability="multi_step_completion", template="multi_step_completion", target="retail", difficulty=0)
    env_dir = write_env_dir(tmp_path / "multi_step_completion", spec, retail)
    result = calibrate_env_dir(env_dir, NoisyOraclePolicy(0.8, seed=1), seeds=40, group_size=8)
    assert [r.difficulty for r in result.rounds] == [0, 1, 2]
    assert not any(r.accepted for r in result.rounds[:2]) and all(r.stats.mean_reward > 0.6 for r in result.rounds[:2])
    assert result.accepted and result.difficulty == 2 and result.stop_reason == "accepted"
    assert 0.2 <= result.stats.success_rate <= 0.6
    saved = read_json(env_dir / "calibration.json")
    assert saved["accepted"] and saved["difficulty"] == 2 and set(saved["stats"]["pass_at_k"]) == {"1", "4", "8"}
    assert load_env_spec(env_dir).difficulty == 2  # env.json follows
    assert load_env_dir(env_dir)().difficulty == 2


def test_loop_stops_at_the_end_of_the_knob(retail):
    from tracerl.envs.synthetic.templates.multi_step import MultiStepCompletionEnv

    result = calibrate(lambda d: (lambda: MultiStepCompletionEnv(retail, difficulty=d)), NoisyOraclePolicy(1.0),
                       difficulty=3, seeds=range(3), group_size=2)
    assert [r.difficulty for r in result.rounds] == [3, 4]
    assert not result.accepted and result.stop_reason == "too easy at difficulty 4, the end of the knob"


def test_loop_stops_when_the_band_lies_between_two_steps(retail):
    # an env whose success only depends on the parity of the difficulty: too easy at even, too hard at odd
    from tracerl.envs.synthetic.templates.multi_step import MultiStepCompletionEnv

    policies = {0: NoisyOraclePolicy(1.0), 1: NoisyOraclePolicy(0.0)}

    class Switching:
        name = "switching"
        level = 0

        def act(self, sessions):
            return policies[self.level % 2].act(sessions)

    policy = Switching()

    def make_env_at(d):
        policy.level = d
        return lambda: MultiStepCompletionEnv(retail, difficulty=d)

    result = calibrate(make_env_at, policy, difficulty=0, seeds=range(2), group_size=2)
    assert [r.difficulty for r in result.rounds] == [0, 1]
    assert result.stop_reason == "the band lies between difficulties 0 and 1"
