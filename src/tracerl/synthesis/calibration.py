"""Calibration: is an environment's difficulty right for the base policy?

Roll the base policy out on S seeds × G samples (one group per seed, as GRPO sees them) and
measure: mean reward, success rate (reward = 1), reward std over all rollouts (and mean std
within groups), the shares of all-success / all-zero / constant / informative groups, and the
unbiased pass@k = 1 − C(n−c, k) / C(n, k) (n samples of a group, c successes), averaged over
groups. TRACE's acceptance bands decide; outside them the difficulty knob moves one step
(too easy → harder, too hard → easier) for up to `max_rounds` rounds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from tracerl.contracts import (
    CalibrationBands,
    CalibrationResult,
    CalibrationRound,
    CalibrationStats,
)
from tracerl.core.policy import Policy
from tracerl.envs.base import Env
from tracerl.envs.runner import Episode, passed, rollout

PASS_AT_K = (1, 4, 8, 16)
CONSTANT_TOLERANCE = 1e-6


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one group: 1 − C(n−c, k)/C(n, k) (Chen et al., 2021). Needs k ≤ n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n and 1 ≤ k ≤ n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def group_stats(groups: Sequence[Sequence[float]], ks: Sequence[int] = PASS_AT_K) -> CalibrationStats:
    """The calibration statistics of reward groups (one list of rewards per seed, equal sizes)."""
    if not groups or any(len(g) == 0 for g in groups):
        raise ValueError("need at least one non-empty group")
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups must have equal sizes, got {sorted(sizes)}")
    n = sizes.pop()
    flat = [float(r) for g in groups for r in g]
    successes = [sum(passed(r) for r in g) for g in groups]
    m = len(groups)
    constant = [max(g) - min(g) <= CONSTANT_TOLERANCE for g in groups]
    return CalibrationStats(
        groups=m,
        group_size=n,
        mean_reward=sum(flat) / len(flat),
        success_rate=sum(successes) / len(flat),
        reward_std=statistics.pstdev(flat),
        mean_group_std=sum(statistics.pstdev(g) for g in groups) / m,
        all_success=sum(c == n for c in successes) / m,
        all_zero=sum(all(abs(r) <= CONSTANT_TOLERANCE for r in g) for g in groups) / m,
        constant=sum(constant) / m,
        informative=sum(not c for c in constant) / m,
        pass_at_k={str(k): sum(pass_at_k(n, c, k) for c in successes) / m for k in ks if k <= n},
    )


def judge(stats: CalibrationStats, bands: CalibrationBands) -> tuple[bool, list[str], int]:
    """(accepted, reasons it is not, direction): +1 = too easy (raise difficulty), −1 = too hard, 0 = unclear."""
    reasons = []
    lo, hi = bands.mean_reward
    if not lo <= stats.mean_reward <= hi:
        reasons.append(f"mean reward {stats.mean_reward:.3f} outside [{lo}, {hi}]")
    lo, hi = bands.success_rate
    if not lo <= stats.success_rate <= hi:
        reasons.append(f"success rate {stats.success_rate:.3f} outside [{lo}, {hi}]")
    if stats.reward_std < bands.min_reward_std:
        reasons.append(f"reward std {stats.reward_std:.3f} < {bands.min_reward_std}")
    if stats.all_success > bands.max_all_success:
        reasons.append(f"all-success groups {stats.all_success:.2f} > {bands.max_all_success}")
    if stats.all_zero > bands.max_all_zero:
        reasons.append(f"all-zero groups {stats.all_zero:.2f} > {bands.max_all_zero}")
    if stats.constant > bands.max_constant:
        reasons.append(f"constant groups {stats.constant:.2f} > {bands.max_constant}")
    if stats.informative < bands.min_informative:
        reasons.append(f"informative groups {stats.informative:.2f} < {bands.min_informative}")
    if not reasons:
        return True, [], 0
    # which way to move: success rate first, then mean reward, then which constant kind dominates
    s_lo, s_hi = bands.success_rate
    m_lo, m_hi = bands.mean_reward
    if stats.success_rate > s_hi or stats.all_success > bands.max_all_success:
        direction = 1
    elif stats.success_rate < s_lo or stats.all_zero > bands.max_all_zero:
        direction = -1
    elif stats.mean_reward > m_hi:
        direction = 1
    elif stats.mean_reward < m_lo:
        direction = -1
    else:
        direction = 0
    return False, reasons, direction


def rollout_groups(make_env: Callable[[], Env], policy: Policy, seeds: Sequence[int], group_size: int,
                   on_done: Callable[[Any], None] | None = None, batch_size: int = 64) -> list[list[float]]:
    """Rewards of `group_size` rollouts of `policy` on each seed, grouped by seed."""
    episodes = [Episode(seed=s) for s in seeds for _ in range(group_size)]
    trajectories = rollout(make_env, policy, episodes, batch_size=batch_size, on_done=on_done)
    return [[t.reward for t in trajectories[i * group_size:(i + 1) * group_size]] for i in range(len(seeds))]


def calibrate(
    make_env_at: Callable[[int], Callable[[], Env]],
    policy: Policy,
    *,
    difficulty: int,
    seeds: Sequence[int],
    group_size: int,
    bands: CalibrationBands | None = None,
    max_rounds: int = 5,
    min_difficulty: int = 0,
    max_difficulty: int = 4,
    settings: dict[str, Any] | None = None,
    on_done: Callable[[Any], None] | None = None,
) -> CalibrationResult:
    """Measure at `difficulty`; while outside the bands, move the knob one step and measure again.

    Stops when accepted, after `max_rounds`, when the knob is at its end, when the direction is
    unclear, or when it would return to a difficulty already measured (the band lies between two steps).
    """
    bands = bands or CalibrationBands()
    rounds: list[CalibrationRound] = []
    tried: dict[int, CalibrationRound] = {}
    stop = ""
    for _ in range(max_rounds):
        groups = rollout_groups(make_env_at(difficulty), policy, seeds, group_size, on_done=on_done)
        stats = group_stats(groups)
        accepted, reasons, direction = judge(stats, bands)
        current = CalibrationRound(difficulty=difficulty, stats=stats, accepted=accepted, reasons=reasons)
        rounds.append(current)
        tried[difficulty] = current
        if accepted:
            stop = "accepted"
            break
        if direction == 0:
            stop = "outside the bands but neither too easy nor too hard (" + "; ".join(reasons) + "): regenerate"
            break
        nxt = difficulty + direction
        if not min_difficulty <= nxt <= max_difficulty:
            stop = f"{'too easy' if direction > 0 else 'too hard'} at difficulty {difficulty}, the end of the knob"
            break
        if nxt in tried:
            stop = f"the band lies between difficulties {min(difficulty, nxt)} and {max(difficulty, nxt)}"
            break
        difficulty = nxt
    else:
        stop = f"not accepted after {max_rounds} rounds"
    final = next((r for r in rounds if r.accepted), None) or _closest(rounds, bands)
    return CalibrationResult(accepted=final.accepted, difficulty=final.difficulty, stats=final.stats, rounds=rounds,
                             stop_reason=stop, bands=bands, policy=getattr(policy, "name", type(policy).__name__),
                             seeds=list(seeds), group_size=group_size, settings=dict(settings or {}))


def _closest(rounds: list[CalibrationRound], bands: CalibrationBands) -> CalibrationRound:
    """The round with the fewest band violations (then success rate nearest the band's centre)."""
    centre = sum(bands.success_rate) / 2
    return min(rounds, key=lambda r: (len(r.reasons), abs(r.stats.success_rate - centre)))
