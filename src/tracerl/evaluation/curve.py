"""`run_curve`: TRACE's sample-efficiency curve — the composed model at every budget its adapters were
evaluated at, measured as GRPO-on-target's `eval_success` is, so the two curves compare point for point.

Every trainer keeps the adapter each of its evaluations measured (`snapshots/step_<n>/`,
`tracerl.training.checkpoint`). At each step where every adapter logged an evaluation and kept its
snapshot, the snapshots are composed with the TRACE composition's recipe and played greedily on the
validation episodes — held-out tasks of the target's train split, GRPO-on-target's evaluation
episodes, as many (`CurveInputs.seeds`). The gates (moe) or router head (router, merge) are not fitted
again: the ones fitted to the final adapters route every point's snapshots
(`tracerl.models.composed.artifact.with_adapters`), so no point pays for composing twice and the gate
data's rollouts are counted once. A point's rollouts are the adapters' `rollouts_used` at its step,
summed, plus the gate-data rollouts, as TRACE's final budget counts them. The final composition is a
point too; the eval stage measures it on the test tasks as well (`eval/<variant>.json`).

Writes `<out>/curve.json` (`TraceCurve`), each point's composed directory `<out>/step_<n>/` (loadable
with `load_composed`, servable with `tracerl serve --model`) and its episodes, `<out>/step_<n>.jsonl`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.contracts import (
    METRICS_FILE,
    CurvePoint,
    MetricsRow,
    TraceCurve,
    adapter_snapshots,
    read_metrics,
)
from tracerl.core.io import write_jsonl
from tracerl.core.sampling import RolloutSettings
from tracerl.core.trajectory import Trajectory
from tracerl.envs.runner import Episode, rollout
from tracerl.models.composed.artifact import load_composed, with_adapters
from tracerl.models.composed.policy import ComposedPolicy

CURVE_FILE = "curve.json"


@dataclass
class CurveInputs:
    variant: str  # the TRACE variant whose composition is reused (the report's TRACE)
    composed: Path  # its composed directory
    adapters: dict[str, Path]  # capability → its training folder (metrics.jsonl, snapshots/)
    gate_rollouts: int  # rollouts the gate data played (gate_data/summary.json)
    seeds: list[int]  # the held-out episodes every point plays (GRPO-on-target's evaluation episodes)
    device: str | None = None  # where the composed model runs (`tracerl.models.placement`; its precision: the composition's)


def curve_steps(metrics: dict[str, list[MetricsRow]], snapshots: dict[str, Iterable[int]],
                gate_rollouts: int) -> list[tuple[int, int]]:
    """(step, rollouts) of each point: the steps where every adapter has a row with eval_success and a
    snapshot; rollouts = the adapters' rollouts_used at the step, summed, + `gate_rollouts`."""
    if not metrics:
        return []
    common: set[int] | None = None
    for name, rows in metrics.items():
        have = {r.step for r in rows if r.eval_success is not None} & set(snapshots.get(name, ()))
        common = have if common is None else common & have
    points = []
    for step in sorted(common or ()):
        used = sum(next(r for r in rows if r.step == step).rollouts_used for rows in metrics.values())
        points.append((step, used + gate_rollouts))
    return points


def run_curve(inputs: CurveInputs, rollout_settings: RolloutSettings, make_env: Callable[[], Any], out: Path, *,
              seed: int, on_done: Callable[[Trajectory], None] | None = None) -> TraceCurve:
    """Measure each point of `curve_steps` (module docstring) on `make_env` at `inputs.seeds`, greedy, and
    write `out/curve.json`, `out/step_<n>/` and `out/step_<n>.jsonl`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("step_*"):  # a previous run's points: this run measures its own
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink()
    kept = {name: adapter_snapshots(folder) for name, folder in inputs.adapters.items()}
    metrics = {name: sorted(read_metrics(folder / METRICS_FILE), key=lambda r: r.step)
               for name, folder in inputs.adapters.items()}
    steps = curve_steps(metrics, kept, inputs.gate_rollouts) if inputs.seeds else []
    note = None
    if not inputs.seeds:
        note = "train.eval_episodes is 0: the validation episodes are off, and so are these points"
    elif not steps:
        note = "no step at which every adapter logged an evaluation and kept its snapshot"
    points = []
    for step, used in steps:
        folder = out / f"step_{step}"
        with_adapters(inputs.composed, {name: kept[name][step] for name in inputs.adapters}, folder)
        policy = ComposedPolicy(load_composed(folder, device=inputs.device), temperature=0.0, seed=seed,
                                max_new_tokens=rollout_settings.max_new_tokens, max_batch_size=rollout_settings.batch_size,
                                kv_cache_tokens=rollout_settings.kv_cache_tokens)
        played = rollout(make_env, policy, [Episode(seed=s) for s in inputs.seeds],
                         batch_size=rollout_settings.batch_size, on_done=on_done)
        write_jsonl(out / f"step_{step}.jsonl", played)
        points.append(CurvePoint(step=step, rollouts=used, passed=sum(t.passed for t in played), episodes=len(played)))
    curve = TraceCurve(variant=inputs.variant, composed=os.path.relpath(inputs.composed, out),
                       eval_seed_start=inputs.seeds[0] if inputs.seeds else 0, points=points, note=note)
    curve.write(out / CURVE_FILE)
    return curve
