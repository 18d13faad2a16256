"""Capability selection speed: aggregation at scale and the rules labeller (not a test).

    python benchmarks/selection_bench.py                      # the figures in benchmarks/README.md
    python benchmarks/selection_bench.py --trajectories 2000  # quicker

1. Aggregation over R runs × T trajectories × C capabilities of seeded random labels: the TRACE
   formulas alone, with the stratified bootstrap (B resamples), and the whole document step
   (LabelRun records → label codes → capabilities.json dict).
2. The rules labeller over T airline rollouts of the flawed policy (all eight built-in
   capabilities), and over the τ²-bench retail sample.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def timed(fn, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def bench_aggregation(runs: int, trajectories: int, capabilities: int, bootstrap: int) -> None:
    from tracerl.core.trajectory import Trajectory
    from tracerl.selection.aggregate import SelectionParams, aggregate
    from tracerl.contracts import Capability, default_rubric
    from tracerl.contracts import LABELS, LabelRun, PairLabel, TrajectoryLabels
    from tracerl.selection.select import capabilities_document

    rng = np.random.default_rng(0)
    passed = rng.random(trajectories) < 0.4
    codes = rng.integers(0, 3, size=(runs, trajectories, capabilities)).astype(np.int8)
    params = SelectionParams(runs=runs, bootstrap=0)
    t0, _ = timed(lambda: aggregate(codes, passed, params), repeat=3)
    params_b = SelectionParams(runs=runs, bootstrap=bootstrap)
    tb, _ = timed(lambda: aggregate(codes, passed, params_b))
    print(f"aggregation {runs} runs × {trajectories:,} trajectories × {capabilities} capabilities:")
    print(f"  formulas only                 {t0 * 1000:8.1f} ms")
    print(f"  with bootstrap B={bootstrap:<5}        {tb * 1000:8.1f} ms")

    caps = [Capability(name=f"cap_{i}", description="d", rubric=default_rubric("d")) for i in range(capabilities)]
    names = [c.name for c in caps]
    labels = [PairLabel(label=x, evidence="e") for x in LABELS]
    records = [
        LabelRun(run=r, seed=r, labeler="bench", capabilities=names, trajectories=[
            TrajectoryLabels(index=t, task_id=str(t), passed=bool(passed[t]),
                             labels={n: labels[codes[r, t, c]] for c, n in enumerate(names)})
            for t in range(trajectories)])
        for r in range(runs)
    ]
    trajs = [Trajectory(task_id=str(t), domain="bench", messages=[], passed=bool(passed[t])) for t in range(trajectories)]
    td, doc = timed(lambda: capabilities_document(caps, records, trajs, params_b, "bench", False))
    assert len(doc.capabilities) == capabilities
    print(f"  whole document (records → capabilities.json, B={bootstrap}) {td:6.2f} s")


def bench_rules(trajectories: int, tau2_data: Path) -> None:
    from tracerl.envs.airline import task_seeds
    from tracerl.envs.loading import load_rollouts
    from tracerl.envs.registry import make_env
    from tracerl.models.factory import make_policy
    from tracerl.envs.runner import Episode, rollout
    from tracerl.selection.catalogue import builtin_capabilities
    from tracerl.selection.rules import RulesLabeller

    caps = builtin_capabilities()
    tr, ts = timed(lambda: rollout(lambda: make_env("airline"), make_policy("flawed:0.3,0.3,0.3,0.3", seed=0, make_env=lambda: make_env("airline")),
                                   [Episode(seed=s) for s in task_seeds("train", trajectories)]))
    labeller = RulesLabeller()
    tl, rows = timed(lambda: labeller.label(ts, caps, 0))
    assert len(rows) == len(ts)
    calls = sum(len(t.tool_calls()) for t in ts)
    print(f"rules labeller, {len(ts):,} airline flawed rollouts ({calls:,} tool calls), {len(caps)} capabilities:")
    print(f"  (collecting them took {tr:.1f} s)")
    print(f"  labelling {tl:8.2f} s  = {len(ts) / tl:,.0f} trajectories/s, {tl / len(ts) * 1e6:,.0f} µs per trajectory")
    sample = tau2_data / "retail" / "sample_results.json"
    if sample.exists():
        tload, tau = timed(lambda: load_rollouts(sample), repeat=3)
        tlab, _ = timed(lambda: labeller.label(tau, caps, 0), repeat=3)
        print(f"τ²-bench retail sample ({len(tau)} runs): load {tload * 1000:.0f} ms, rules labelling {tlab * 1000:.0f} ms")


def main() -> None:
    import torch

    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--capabilities", type=int, default=10)
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args()
    tau2_data = Path(__file__).resolve().parents[1] / "tests" / "data" / "tau2"  # τ²-bench's retail sample, with its licence
    bench_aggregation(args.runs, args.trajectories, args.capabilities, args.bootstrap)
    bench_rules(args.trajectories, tau2_data)


if __name__ == "__main__":
    main()
