"""Evaluation statistics: τ²-bench's pass^k, bootstrap intervals over tasks, paired differences."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from math import comb, sqrt

import numpy as np

from tracerl.contracts import Interval
from tracerl.core.trajectory import Trajectory


def pass_hat_k(successes_per_task: Sequence[tuple[int, int]], k: int) -> float:
    """τ²-bench's pass^k: mean over tasks of C(c, k) / C(n, k), n trials with c successes each.

    The chance that k trials drawn without replacement all succeed; pass^1 is the success rate.
    """
    if not successes_per_task:
        return 0.0
    values = []
    for n, c in successes_per_task:
        if n < k:
            raise ValueError(f"pass^{k} needs at least {k} trials per task, a task has {n}")
        values.append(comb(c, k) / comb(n, k))
    return float(np.mean(values))


def successes_by_task(trajectories: Sequence[Trajectory]) -> dict[str, tuple[int, int]]:
    """task id → (trials, successes)."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for t in trajectories:
        counts[t.task_id][0] += 1
        counts[t.task_id][1] += int(t.passed)
    return {task: (n, c) for task, (n, c) in counts.items()}


def bootstrap_mean(values: Sequence[float], *, seed: int = 0, resamples: int = 2000, level: float = 0.95) -> Interval:
    """Mean and percentile bootstrap interval, resampling the per-task values with replacement."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return Interval(mean=0.0, low=0.0, high=0.0)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    alpha = (1 - level) / 2
    return Interval(mean=float(x.mean()), low=float(np.quantile(means, alpha)), high=float(np.quantile(means, 1 - alpha)))


def paired_difference(
    variant: dict[str, float], base: dict[str, float], *, seed: int = 0, resamples: int = 2000
) -> Interval:
    """Mean of (variant − base) over the tasks both were run on, with a bootstrap interval over tasks."""
    tasks = sorted(set(variant) & set(base))
    return bootstrap_mean([variant[t] - base[t] for t in tasks], seed=seed, resamples=resamples)


def per_task_pass_rate(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """task id → share of its trials that passed (pass^1 per task)."""
    return {task: c / n for task, (n, c) in successes_by_task(trajectories).items()}


def wilson_interval(passed: int, n: int, z: float = 1.959963984540054) -> Interval:
    """A success rate passed / n and its Wilson score interval (95% by default): the interval for a
    proportion that stays inside [0, 1] and is not empty at 0 or n successes, unlike the normal one."""
    if n <= 0:
        raise ValueError(f"an interval needs at least one trial, got {n}")
    if not 0 <= passed <= n:
        raise ValueError(f"{passed} successes of {n} trials")
    p = passed / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z / denominator * sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return Interval(mean=p, low=max(0.0, center - half), high=min(1.0, center + half))
