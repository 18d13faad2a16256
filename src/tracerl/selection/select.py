"""Step 1 end to end: label N runs, aggregate, write `DIR/labels/run_XX.json` and `DIR/capabilities.json`.

capabilities.json is `tracerl.contracts.CapabilitiesFile`: the parameters, totals and labeller,
then every candidate capability ranked (selected first, then by mean Δ) with its figures per run
and over runs. Standard deviations are over runs (population, ddof = 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.contracts import (
    CapabilitiesFile,
    Capability,
    CapabilityResult,
    FailedExample,
    LabelerInfo,
    LabelRun,
    RunFigures,
    SelectionSettings,
    Totals,
    Workspace,
)
from tracerl.core.trajectory import Trajectory
from tracerl.selection.aggregate import Aggregate, SelectionParams, aggregate
from tracerl.selection.labels import Labeller, label_codes, make_run

EXAMPLES = 3


def label_runs(
    labeller: Labeller,
    trajectories: list[Trajectory],
    capabilities: list[Capability],
    params: SelectionParams,
    out_dir: Path | None = None,
    on_run: Callable[[int], None] | None = None,
) -> list[LabelRun]:
    """N labelling runs with seeds seed+0 … seed+N−1; the run files are written (each atomically) once
    every run is labelled, so a labeller that stops (an analysis model that gives nothing usable) leaves
    none. A deterministic labeller is run once and its labels reused for every run."""
    runs: list[LabelRun] = []
    first = None
    for r in range(params.runs):
        seed = params.seed + r
        if labeller.deterministic and first is not None:
            labels, problems = first
        else:
            labels = labeller.label(trajectories, capabilities, seed)
            problems = list(getattr(labeller, "problems", []))
            first = (labels, problems)
        runs.append(make_run(r, seed, labeller.name, trajectories, capabilities, labels, problems))
        if on_run is not None:
            on_run(r)
    if out_dir is not None:
        for r, run in enumerate(runs):
            run.write(Workspace(out_dir).label_run(r))
    return runs


def _num(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else round(x, 6)


def capabilities_document(
    capabilities: list[Capability], runs: list[LabelRun], trajectories: list[Trajectory], params: SelectionParams,
    labeler_name: str, deterministic: bool,
) -> CapabilitiesFile:
    """Aggregate the runs into capabilities.json's content."""
    passed = np.array([t.passed for t in trajectories], dtype=bool)
    agg = aggregate(label_codes(runs), passed, params)
    caps = []
    for rank, c in enumerate(agg.order, start=1):
        caps.append(CapabilityResult(
            **capabilities[c].model_dump(),
            selected=bool(agg.selected[c]),
            rank=rank,
            status="PENDING" if agg.selected[c] else None,
            mean_cov=_num(agg.mean_cov[c]),
            std_cov=_num(agg.std_cov[c]),
            cov_ci95=tuple(_num(v) for v in agg.cov_ci95[c]),
            mean_delta=_num(agg.mean_delta[c]),
            std_delta=_num(agg.std_delta[c]),
            delta_ci95=tuple(_num(v) for v in agg.delta_ci95[c]),
            mean_er_minus=_num(agg.mean_er_minus[c]),
            mean_er_plus=_num(agg.mean_er_plus[c]),
            runs_passed=int(agg.runs_passed[c]),
            runs_total=len(runs),
            er_plus_empty_runs=int(agg.er_plus_empty_runs[c]),
            er_plus_flag=bool(agg.er_plus_empty_runs[c] > 0),
            unlabelled_pairs=int(agg.unlabelled[c]),
            per_run=_per_run(agg, c),
            example_failed=_examples(agg, c, runs, passed),
        ))
    n_failed = int((~passed).sum())
    note = (
        "the rules labeller is deterministic: every run gives identical labels, so K-of-N is met trivially"
        if deterministic else f"{len(runs)} independent runs with distinct seeds"
    )
    return CapabilitiesFile(
        params=SelectionSettings(rho=params.rho, delta=params.delta, k=params.k, n=params.runs,
                                 bootstrap=params.bootstrap, seed=params.seed),
        totals=Totals(trajectories=len(trajectories), failed=n_failed, passed=len(trajectories) - n_failed),
        labeler=LabelerInfo(name=labeler_name, deterministic=deterministic, note=note),
        unlabelled_pairs=int(agg.unlabelled.sum()),
        capabilities=caps,
    )


def _per_run(agg: Aggregate, c: int) -> list[RunFigures]:
    return [
        RunFigures(run=r, LF=int(m.LF[c]), PF=int(m.PF[c]), NF=int(m.NF[c]), LP=int(m.LP[c]), PP=int(m.PP[c]),
                   NP=int(m.NP[c]), cov=_num(m.cov[c]), er_minus=_num(m.er_minus[c]), er_plus=_num(m.er_plus[c]),
                   delta=_num(m.delta[c]), passed=bool(agg.passes[r, c]))
        for r, m in enumerate(agg.runs)
    ]


def _examples(agg: Aggregate, c: int, runs: list[LabelRun], passed: np.ndarray) -> list[FailedExample]:
    """Failed trajectories most often labelled LACKING for capability c (ties: file order)."""
    counts = agg.lacking_runs[:, c]
    failed = np.flatnonzero(~passed & (counts > 0))
    ranked = sorted(failed, key=lambda t: (-counts[t], t))[:EXAMPLES]
    name = runs[0].capabilities[c] if runs else ""
    out = []
    for t in ranked:
        evidence = next(run.trajectories[t].labels[name].evidence for run in runs if run.trajectories[t].labels[name].label == "LACKING")
        out.append(FailedExample(index=int(t), task_id=runs[0].trajectories[t].task_id, lacking_runs=int(counts[t]),
                                 evidence=evidence))
    return out


def select_capabilities(
    trajectories: list[Trajectory],
    capabilities: list[Capability],
    labeller: Labeller,
    params: SelectionParams = SelectionParams(),
    out_dir: Path | None = None,
    on_run: Callable[[int], None] | None = None,
) -> tuple[CapabilitiesFile, list[LabelRun]]:
    """Step 1 in one call (what `tracerl select` and the pipeline run): label N runs, aggregate,
    and — with `out_dir` — write `labels/run_XX.json` and then `capabilities.json`."""
    runs = label_runs(labeller, trajectories, capabilities, params, out_dir=out_dir, on_run=on_run)
    document = capabilities_document(capabilities, runs, trajectories, params, labeller.name, labeller.deterministic)
    if out_dir is not None:
        document.write(out_dir / "capabilities.json")
    return document, runs
