"""Aggregation — exactly TRACE's formulas (../shared/TRACE.md, Step 1), plus honest statistics.

Per run r and capability c, with LF/PF/NF the LACKING/PRESENT/NA counts among failed
trajectories and LP/PP/NP among passed ones:

    Cov  = LF / #failed            (NA counts in the denominator)
    ER−  = LF / (LF + PF)          (0 when the denominator is 0)
    ER+  = LP / (LP + PP)          (0 when the denominator is 0)
    Δ    = ER− − ER+
    c passes run r  iff  Cov ≥ ρ and Δ ≥ δ;   c is selected iff it passes ≥ K of the N runs;
    capabilities are ranked by mean Δ.

Unlabelled pairs (label code −1) are left out of every count, #failed included; with none, the
formulas are TRACE's to the letter (thresholds compared with a 1e-9 slack, so that a value
equal to ρ or δ passes despite float rounding). Beyond the reference: a stratified bootstrap 95% interval
for the mean (over runs) Cov and Δ, resampling trajectories — failed and passed separately, so
#failed stays fixed — with the same resample for every run; a flag for runs where ER+ = 0
only because the capability never applied to a passed trajectory (empty denominator); and
example failed cases ranked by how many runs labelled them LACKING.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tracerl.selection.labels import LACKING, NA, PRESENT

# Thresholds are compared with this slack so that a value equal to ρ or δ in exact arithmetic
# passes despite float rounding (0.3 − 0.1 = 0.19999999999999998 in binary floating point).
TOLERANCE = 1e-9


@dataclass(frozen=True)
class SelectionParams:
    """ρ, δ, K of N and the bootstrap settings. K defaults to round(0.8·N) (8 of 10)."""

    rho: float = 0.10
    delta: float = 0.20
    runs: int = 10
    min_runs: int | None = None  # K; None → round(0.8 · runs)
    bootstrap: int = 1000
    seed: int = 0

    @property
    def k(self) -> int:
        return self.min_runs if self.min_runs is not None else max(1, round(0.8 * self.runs))


@dataclass
class RunMetrics:
    """Counts and metrics of every capability in one run; arrays of shape [capabilities]."""

    LF: np.ndarray
    PF: np.ndarray
    NF: np.ndarray
    LP: np.ndarray
    PP: np.ndarray
    NP: np.ndarray
    cov: np.ndarray
    er_minus: np.ndarray
    er_plus: np.ndarray
    delta: np.ndarray
    er_plus_empty: np.ndarray  # LP + PP == 0


@dataclass
class Aggregate:
    """Everything aggregation finds, per capability (arrays over capabilities; `runs` per run)."""

    runs: list[RunMetrics]
    passes: np.ndarray  # [run, capability] bool
    runs_passed: np.ndarray
    selected: np.ndarray
    mean_cov: np.ndarray
    std_cov: np.ndarray
    mean_delta: np.ndarray
    std_delta: np.ndarray
    mean_er_minus: np.ndarray
    mean_er_plus: np.ndarray
    cov_ci95: np.ndarray  # [capability, 2]
    delta_ci95: np.ndarray
    er_plus_empty_runs: np.ndarray
    unlabelled: np.ndarray  # unlabelled pairs over all runs
    lacking_runs: np.ndarray  # [trajectory, capability]: runs that labelled the pair LACKING
    order: list[int] = field(default_factory=list)  # capability indices, ranked


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, 0 where den == 0 (TRACE's convention)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den != 0)


def run_metrics(codes: np.ndarray, passed: np.ndarray) -> RunMetrics:
    """TRACE's per-run metrics from one run's label codes [trajectory, capability]."""
    codes = np.asarray(codes)
    failed = ~np.asarray(passed, dtype=bool)
    f, p = codes[failed], codes[~failed]
    LF, PF, NF = (f == LACKING).sum(0), (f == PRESENT).sum(0), (f == NA).sum(0)
    LP, PP, NP = (p == LACKING).sum(0), (p == PRESENT).sum(0), (p == NA).sum(0)
    cov = _ratio(LF, LF + PF + NF)
    er_minus = _ratio(LF, LF + PF)
    er_plus = _ratio(LP, LP + PP)
    return RunMetrics(LF, PF, NF, LP, PP, NP, cov, er_minus, er_plus, er_minus - er_plus, (LP + PP) == 0)


def aggregate(codes: np.ndarray, passed: np.ndarray, params: SelectionParams = SelectionParams()) -> Aggregate:
    """Aggregate label codes [run, trajectory, capability] (NA 0, PRESENT 1, LACKING 2, unlabelled −1)."""
    codes = np.asarray(codes)
    passed = np.asarray(passed, dtype=bool)
    n_runs, _, n_caps = codes.shape
    k = params.k
    runs = [run_metrics(codes[r], passed) for r in range(n_runs)]
    cov = np.stack([m.cov for m in runs]) if runs else np.zeros((0, n_caps))
    delta = np.stack([m.delta for m in runs]) if runs else np.zeros((0, n_caps))
    passes = (cov >= params.rho - TOLERANCE) & (delta >= params.delta - TOLERANCE)
    runs_passed = passes.sum(0)
    cov_ci, delta_ci = bootstrap_intervals(codes, passed, params.bootstrap, params.seed)
    mean_delta = delta.mean(0) if n_runs else np.zeros(n_caps)
    selected = runs_passed >= k
    agg = Aggregate(
        runs=runs,
        passes=passes,
        runs_passed=runs_passed,
        selected=selected,
        mean_cov=cov.mean(0) if n_runs else np.zeros(n_caps),
        std_cov=cov.std(0) if n_runs else np.zeros(n_caps),
        mean_delta=mean_delta,
        std_delta=delta.std(0) if n_runs else np.zeros(n_caps),
        mean_er_minus=np.mean([m.er_minus for m in runs], 0) if runs else np.zeros(n_caps),
        mean_er_plus=np.mean([m.er_plus for m in runs], 0) if runs else np.zeros(n_caps),
        cov_ci95=cov_ci,
        delta_ci95=delta_ci,
        er_plus_empty_runs=np.sum([m.er_plus_empty for m in runs], 0).astype(int) if runs else np.zeros(n_caps, int),
        unlabelled=(codes < 0).sum((0, 1)),
        lacking_runs=(codes == LACKING).sum(0),
    )
    agg.order = sorted(range(n_caps), key=lambda c: (not selected[c], -mean_delta[c], c))
    return agg


def bootstrap_intervals(codes: np.ndarray, passed: np.ndarray, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Percentile 95% intervals [capability, 2] of mean-over-runs Cov and Δ under a stratified
    trajectory bootstrap (`samples` resamples; 0 gives NaN intervals)."""
    n_runs, _, n_caps = codes.shape
    nan = np.full((n_caps, 2), np.nan)
    if samples <= 0 or n_runs == 0:
        return nan, nan.copy()
    rng = np.random.default_rng(seed)
    failed = ~passed

    def counts(group: np.ndarray) -> dict[str, np.ndarray]:
        """Resampled LACKING / PRESENT / labelled counts, each [sample, run, capability]."""
        sub = codes[:, group, :]  # [run, n, cap]
        n = sub.shape[1]
        if n == 0:
            zero = np.zeros((samples, n_runs, n_caps))
            return {"L": zero, "P": zero, "A": zero}
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=samples).astype(np.float32)  # [sample, n]
        flat = sub.transpose(1, 0, 2).reshape(n, n_runs * n_caps)  # [n, run·cap]
        out = {}
        for key, mask in (("L", flat == LACKING), ("P", flat == PRESENT), ("A", flat >= 0)):
            out[key] = (weights @ mask.astype(np.float32)).reshape(samples, n_runs, n_caps).astype(np.float64)
        return out

    f = counts(failed)
    p = counts(~failed)
    cov = _ratio(f["L"], f["A"]).mean(1)  # [sample, cap]
    delta = (_ratio(f["L"], f["L"] + f["P"]) - _ratio(p["L"], p["L"] + p["P"])).mean(1)
    return np.percentile(cov, [2.5, 97.5], axis=0).T, np.percentile(delta, [2.5, 97.5], axis=0).T
