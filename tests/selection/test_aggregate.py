"""Aggregation against hand-computed tables (TRACE Step 1 formulas)."""

from __future__ import annotations

import numpy as np
import pytest

from tracerl.selection.aggregate import SelectionParams, aggregate, bootstrap_intervals, run_metrics

N, P, L, U = 0, 1, 2, -1
PASSED = np.array([False] * 5 + [True] * 5)

# one run, columns = capabilities c0..c4; rows 0-4 failed, 5-9 passed
RUN0 = np.array([
    #  c0 c1 c2 c3 c4
    [L, N, L, L, L],
    [L, N, N, P, U],
    [L, N, N, P, N],
    [P, N, N, P, N],
    [N, N, N, P, N],
    [P, L, N, P, P],
    [P, P, N, P, P],
    [L, N, N, P, P],
    [N, N, N, P, P],
    [N, N, N, P, P],
])


def test_run_metrics_match_hand_computation() -> None:
    m = run_metrics(RUN0, PASSED)
    assert m.LF.tolist() == [3, 0, 1, 1, 1] and m.PF.tolist() == [1, 0, 0, 4, 0] and m.NF.tolist() == [1, 5, 4, 0, 3]
    assert m.LP.tolist() == [1, 1, 0, 0, 0] and m.PP.tolist() == [2, 1, 0, 5, 5] and m.NP.tolist() == [2, 3, 5, 0, 0]
    # c0: Cov 3/5, ER− 3/4, ER+ 1/3
    assert m.cov[0] == pytest.approx(0.6) and m.er_minus[0] == pytest.approx(0.75) and m.er_plus[0] == pytest.approx(1 / 3)
    assert m.delta[0] == pytest.approx(0.75 - 1 / 3)
    # c1: empty failure-side denominator ⇒ ER− = 0; ER+ = 1/2 ⇒ Δ = −1/2
    assert m.cov[1] == 0 and m.er_minus[1] == 0 and m.er_plus[1] == pytest.approx(0.5) and m.delta[1] == pytest.approx(-0.5)
    # c2: never applied to a passed trajectory ⇒ ER+ = 0 by the empty-denominator rule, flagged
    assert m.cov[2] == pytest.approx(0.2) and m.er_minus[2] == 1 and m.er_plus[2] == 0 and m.delta[2] == 1
    assert m.er_plus_empty.tolist() == [False, False, True, False, False]
    # c3: Δ exactly at δ = 0.2 (1/5 − 0)
    assert m.cov[3] == pytest.approx(0.2) and m.delta[3] == pytest.approx(0.2)
    # c4: the unlabelled pair is left out of #failed: Cov = 1/4
    assert m.cov[4] == pytest.approx(0.25) and m.er_minus[4] == 1 and m.er_plus[4] == 0 and not m.er_plus_empty[4]


def test_k_of_n_selection_means_stds_and_ranking() -> None:
    run2 = RUN0.copy()
    run2[:5, 0] = [P, P, P, P, N]  # c0 in run 2: LF 0 ⇒ Cov 0, ER− 0, Δ = −1/3
    codes = np.stack([RUN0, RUN0, run2])
    params = SelectionParams(runs=3, min_runs=2, bootstrap=0)
    agg = aggregate(codes, PASSED, params)
    assert agg.passes[:, 0].tolist() == [True, True, False]
    assert agg.runs_passed.tolist() == [2, 0, 3, 3, 3]
    assert agg.selected.tolist() == [True, False, True, True, True]
    assert agg.mean_cov[0] == pytest.approx(0.4) and agg.std_cov[0] == pytest.approx(np.sqrt(0.08))
    d = 0.75 - 1 / 3
    assert agg.mean_delta[0] == pytest.approx((2 * d - 1 / 3) / 3)
    assert agg.std_delta[0] == pytest.approx(np.std([d, d, -1 / 3]))
    assert agg.er_plus_empty_runs.tolist() == [0, 0, 3, 0, 0]
    assert agg.unlabelled.tolist() == [0, 0, 0, 0, 3]
    # selected first, by mean Δ (c2, c4 tie at 1 → index order), then the rest
    assert agg.order == [2, 4, 3, 0, 1]
    # K = 3 of 3: c0 passes only 2 runs
    assert not aggregate(codes, PASSED, SelectionParams(runs=3, min_runs=3, bootstrap=0)).selected[0]
    # failed trajectories' LACKING counts over runs (for the example cases)
    assert agg.lacking_runs[:5, 0].tolist() == [2, 2, 2, 0, 0]


def test_thresholds_are_inclusive_and_configurable() -> None:
    codes = RUN0[None]
    agg = aggregate(codes, PASSED, SelectionParams(runs=1, min_runs=1, rho=0.2, delta=0.2, bootstrap=0))
    assert agg.selected.tolist() == [True, False, True, True, True]
    agg = aggregate(codes, PASSED, SelectionParams(runs=1, min_runs=1, rho=0.21, delta=0.2, bootstrap=0))
    assert agg.selected.tolist() == [True, False, False, False, True]


def test_default_k_is_eight_of_ten() -> None:
    assert SelectionParams().k == 8 and SelectionParams(runs=5).k == 4 and SelectionParams(runs=1).k == 1


def test_bootstrap_interval_collapses_on_separable_labels_and_is_seeded() -> None:
    codes = np.zeros((2, 10, 2), dtype=np.int8)
    codes[:, :5, 0] = L  # c0: every failed LACKING, every passed PRESENT
    codes[:, 5:, 0] = P
    codes[:, :, 1] = RUN0[:, 0]
    cov, delta = bootstrap_intervals(codes, PASSED, 500, seed=1)
    assert cov[0].tolist() == [1.0, 1.0] and delta[0].tolist() == [1.0, 1.0]
    point = run_metrics(RUN0, PASSED)
    assert cov[1, 0] <= point.cov[0] <= cov[1, 1] and delta[1, 0] <= point.delta[0] <= delta[1, 1]
    assert cov[1, 0] < cov[1, 1]  # real spread on mixed labels
    again = bootstrap_intervals(codes, PASSED, 500, seed=1)
    assert np.array_equal(again[0], cov) and np.array_equal(again[1], delta)
    assert np.isnan(bootstrap_intervals(codes, PASSED, 0, seed=1)[0]).all()


def test_no_passed_trajectories_at_all() -> None:
    codes = np.array([[[L], [P]]], dtype=np.int8)
    agg = aggregate(codes, np.array([False, False]), SelectionParams(runs=1, min_runs=1, bootstrap=50))
    assert agg.mean_cov[0] == 0.5 and agg.mean_er_plus[0] == 0 and agg.er_plus_empty_runs[0] == 1
    assert agg.selected[0]


def test_a_gap_equal_to_delta_passes_despite_float_rounding() -> None:
    # failed: 3 LACKING, 7 PRESENT (ER− = 0.3); passed: 1 LACKING, 9 PRESENT (ER+ = 0.1); Δ = 0.2 exactly
    codes = np.array([[L] * 3 + [P] * 7 + [L] + [P] * 9], dtype=np.int8).reshape(1, 20, 1)
    passed = np.array([False] * 10 + [True] * 10)
    m = run_metrics(codes[0], passed)
    assert m.delta[0] != 0.2 and m.delta[0] == pytest.approx(0.2)  # binary floating point
    assert aggregate(codes, passed, SelectionParams(runs=1, min_runs=1, rho=0.3, delta=0.2, bootstrap=0)).selected[0]
    assert not aggregate(codes, passed, SelectionParams(runs=1, min_runs=1, rho=0.3, delta=0.2001, bootstrap=0)).selected[0]
