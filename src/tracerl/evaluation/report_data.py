"""The report's data: read a workspace's stage outputs into one `ReportData`, each file through its
contract (`tracerl.contracts`; calibration.json through `CalibrationResult`).

Each stage writes its own files (layout in `tracerl.pipeline`); this module reads whatever exists. A
stage that has not run yet leaves its section empty (`ReportData.missing` says why); a file that
exists but does not fit its contract raises `InputError` naming the file (and line, for JSONL).
Nothing here writes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from tracerl.contracts import (
    COMPOSITION_MODES,
    BestCheckpoint,
    CalibrationResult,
    CapabilitiesFile,
    CompositionSpec,
    EfficiencyPoint,
    EvalResult,
    Headline,
    HeadlineEntry,
    Interval,
    MetricsRow,
    Outcome,
    ReportSummary,
    RolloutCount,
    SampleEfficiency,
    TraceCurve,
    TrainingFinal,
    TrainingSummary,
    Workspace,
    eval_file_stem,
    read_metrics,
)
from tracerl.contracts import (
    Example as ExampleSummary,
)
from tracerl.core.errors import InputError
from tracerl.core.io import read_jsonl
from tracerl.core.trajectory import Trajectory
from tracerl.evaluation.stats import paired_difference, wilson_interval

# Display order of the evaluation variants; `adapter:<capability>` ones go after the baselines.
VARIANT_ORDER = ("base", "prompt_capabilities", "gepa", "grpo_target", "swe_rl", "adapter:", "trace_merge", "trace_router",
                 "trace_moe")
GEPA_NOT_RUN = ("GEPA (baselines.gepa) did not run: it needs an analysis model as its reflection model "
                "(analysis.base_url and analysis.model, or $OPENAI_BASE_URL and $TRACERL_LLM_MODEL).")
EXAMPLES_SHOWN = 2


# ----------------------------------------------------------------------------- the assembled report


class TrainingCurve(BaseModel):
    """One adapter's (or the GRPO-on-target baseline's) training metrics."""

    name: str
    source: str  # the metrics.jsonl path, relative to the workspace
    rows: list[MetricsRow]

    def final(self) -> TrainingFinal:
        """The last row's figures plus the first and last held-out success seen."""
        last = self.rows[-1]
        evals = [r for r in self.rows if r.eval_success is not None]
        return TrainingFinal(steps=last.step, rollouts_used=last.rollouts_used, reward_mean=last.reward_mean,
                             success_rate=last.success_rate, eval_success=evals[-1].eval_success if evals else None,
                             eval_success_start=evals[0].eval_success if evals else None)


class Example(BaseModel):
    """One test task shown side by side: the base model's episode and TRACE's."""

    task_id: str
    base: Trajectory
    trace: Trajectory


class ReportData(BaseModel):
    """Everything the report shows, read from one workspace."""

    workspace: str
    config_text: str | None = None
    base_rollouts: dict[str, int] | None = None  # {"trajectories", "passed"} of rollouts/base.jsonl
    capabilities: CapabilitiesFile | None = None
    calibration: dict[str, CalibrationResult] = Field(default_factory=dict)
    training: dict[str, TrainingCurve] = Field(default_factory=dict)  # capability → curve
    trained_rejected: list[str] = Field(default_factory=list)  # adapters trained on an environment calibration rejected
    grpo_training: TrainingCurve | None = None
    swe_rl_training: TrainingCurve | None = None  # SWE-RL's baseline (a code target's `baselines.swe_rl`)
    evaluation: dict[str, EvalResult] = Field(default_factory=dict)  # variant → figures, display order
    composition: CompositionSpec | None = None
    routing_accuracy: float | None = None
    routing_accuracy_by_capability: dict[str, float] = Field(default_factory=dict)
    sample_efficiency: SampleEfficiency | None = None
    trace_variant: str | None = None
    trace_vs_grpo: Interval | None = None  # paired difference over tasks, TRACE − GRPO-on-target
    trace_vs_swe_rl: Interval | None = None  # … TRACE − SWE-RL
    examples: list[Example] = Field(default_factory=list)
    gepa_on: bool = False  # the run's config has baselines.gepa on
    missing: dict[str, str] = Field(default_factory=dict)  # section → why it is empty

    def summary(self) -> ReportSummary:
        """report.json: every figure the page shows (conversations summarised by outcome)."""
        return ReportSummary(
            workspace=self.workspace,
            headline=self.headline(),
            base_rollouts=RolloutCount(**self.base_rollouts) if self.base_rollouts else None,
            capabilities=self.capabilities,
            calibration=self.calibration,
            trained_rejected=self.trained_rejected,
            training={name: TrainingSummary(source=c.source, final=c.final(), rows=c.rows)
                      for name, c in self._all_curves().items()},
            evaluation=self.evaluation,
            routing_accuracy=self.routing_accuracy,
            routing_accuracy_by_capability=self.routing_accuracy_by_capability,
            composition=self.composition,
            sample_efficiency=self.sample_efficiency,
            examples=[ExampleSummary(task_id=ex.task_id, base=_outcome(ex.base), trace=_outcome(ex.trace))
                      for ex in self.examples],
            missing=self.missing,
        )

    def headline(self) -> Headline:
        """TRACE vs base vs GRPO-on-target (and the prompting baseline), with intervals."""

        def entry(variant: str | None) -> HeadlineEntry | None:
            e = self.evaluation.get(variant) if variant else None
            if e is None:
                return None
            return HeadlineEntry(variant=e.variant, pass1=e.pass1, diff_vs_base=e.diff_vs_base,
                                 rollouts_used=e.rollouts_used)

        headline = Headline(trace=entry(self.trace_variant), base=entry("base"), grpo_target=entry("grpo_target"),
                            prompt_capabilities=entry("prompt_capabilities"), gepa=entry("gepa"),
                            trace_vs_grpo_target=self.trace_vs_grpo,
                            swe_rl=entry("swe_rl"), trace_vs_swe_rl=self.trace_vs_swe_rl,
                            routing_accuracy=self.routing_accuracy)
        headline.answer = answer(headline)
        headline.notes = headline_notes(self)
        return headline

    def _all_curves(self) -> dict[str, TrainingCurve]:
        curves = dict(self.training)
        if self.grpo_training is not None:
            curves["grpo_target"] = self.grpo_training
        if self.swe_rl_training is not None:
            curves["swe_rl"] = self.swe_rl_training
        return curves


def answer(headline: Headline) -> str | None:
    """Does TRACE help here, by how much, at what budget — from the paired differences' 95% intervals.

    "Yes" when the interval of TRACE − base lies above 0, "No, it does worse" below 0, "Not shown"
    when it holds 0; the comparisons with GRPO on the target and with SWE-RL (rollouts counted the same
    way) follow when they were run.
    """
    trace, base = headline.trace, headline.base
    if trace is None or base is None or trace.diff_vs_base is None:
        return None
    d = trace.diff_vs_base
    verdict = "Yes" if d.low > 0 else "No, it does worse" if d.high < 0 else "Not shown"
    name = trace.variant.replace("trace_", "")
    text = (f"Does TRACE help here? {verdict}: TRACE ({name}) passes {pct(trace.pass1.mean)} of the held-out tasks, "
            f"the base agent {pct(base.pass1.mean)} ({_points(d)})")
    compared = []  # (name, rollouts) of the baselines compared
    for label, e, diff in (("GRPO on the target", headline.grpo_target, headline.trace_vs_grpo_target),
                           ("SWE-RL", headline.swe_rl, headline.trace_vs_swe_rl)):
        if e is not None and diff is not None:
            than = "better than" if diff.low > 0 else "worse than" if diff.high < 0 else "no different from"
            text += f"; {than} {label} at {pct(e.pass1.mean)} ({_points(diff)})"
            compared.append((label.split()[0], e.rollouts_used))
    if not compared:
        return text + f", with {trace.rollouts_used:,} training rollouts."
    if any(used != trace.rollouts_used for _, used in compared):
        return text + (f"; TRACE used {trace.rollouts_used:,} training rollouts, "
                       + ", ".join(f"{label} {used:,}" for label, used in compared) + ".")
    return text + f"; {'both' if len(compared) == 1 else 'all'} with {trace.rollouts_used:,} training rollouts."


def headline_notes(data: ReportData) -> list[str]:
    """What qualifies the headline's answer, one sentence each."""
    notes = []
    if data.trained_rejected:
        names = ", ".join(data.trained_rejected)
        notes.append(f"Calibration rejected the environment{'s' if len(data.trained_rejected) > 1 else ''} of {names} "
                     "(outside TRACE's bands); the run trained on them anyway (train_rejected).")
    flat = [name for name, c in data.training.items()
            if (f := c.final()).eval_success is not None and f.eval_success_start is not None
            and f.eval_success <= f.eval_success_start]
    if flat:
        notes.append(f"Learnt nothing on its own environment's held-out episodes: {', '.join(flat)} (held-out success "
                     "at the last evaluation no higher than before training).")
    for c in data.capabilities.capabilities if data.capabilities else []:
        if not c.selected and c.note:
            notes.append(f"{c.name} passed selection's thresholds but was left out: {c.note}.")
    se = data.sample_efficiency
    for name, label in (("grpo_target", "GRPO on the target"), ("swe_rl", "SWE-RL"), ("trace", "TRACE")):
        best = se.best.get(name) if se else None
        if best is not None and best.beats_last:
            notes.append(f"{label}'s best validation checkpoint (step {best.step}, {pct(best.success)}) beats its last "
                         f"(step {best.last_step}, {pct(best.last_success)}); the test tasks measure the last.")
    return notes


def pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.1f}%"


def interval_text(i: Interval, *, points: bool = False) -> str:
    if points:
        return f"95% CI [{i.low * 100:+.1f}, {i.high * 100:+.1f}]"
    return f"95% CI [{i.low * 100:.1f}, {i.high * 100:.1f}]"


def _points(i: Interval) -> str:
    return f"{100 * i.mean:+.1f} points, {interval_text(i, points=True)}"


# ----------------------------------------------------------------------------- reading


def load_report_data(workspace: str | Path) -> ReportData:
    """Read every stage output present in `workspace`; `InputError` for a malformed file."""
    ws = Path(workspace)
    if not ws.is_dir():
        raise InputError("workspace folder does not exist", path=str(ws))
    data = ReportData(workspace=str(ws))
    _read_config(ws, data)
    _read_base_rollouts(ws, data)
    _read_capabilities(ws, data)
    _read_calibration(ws, data)
    _read_training(ws, data)
    data.trained_rejected = [name for name in data.training
                             if name in data.calibration and data.calibration[name].accepted is False]
    _read_evaluation(ws, data)
    _read_composition(ws, data)
    _read_sample_efficiency(ws, data)
    _read_examples(ws, data)
    return data


def _read_config(ws: Path, data: ReportData) -> None:
    path = ws / "config.yaml"
    if not path.is_file():
        data.missing["config"] = "config.yaml not found: the run's configuration was not saved yet."
        return
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(f"not valid YAML ({getattr(e, 'problem', e)})", path=str(path),
                         line=mark.line + 1 if mark else None) from None
    data.config_text = text
    baselines = config.get("baselines") if isinstance(config, dict) else None
    data.gepa_on = bool(baselines.get("gepa", False)) if isinstance(baselines, dict) else False


def _read_base_rollouts(ws: Path, data: ReportData) -> None:
    path = ws / "rollouts" / "base.jsonl"
    if not path.is_file():
        data.missing["rollouts"] = "rollouts/base.jsonl not found: the collect stage has not run yet."
        return
    trajectories = read_jsonl(path, Trajectory)
    data.base_rollouts = {"trajectories": len(trajectories), "passed": sum(t.passed for t in trajectories)}


def _read_capabilities(ws: Path, data: ReportData) -> None:
    path = ws / "capabilities.json"
    if not path.is_file():
        data.missing["capabilities"] = "capabilities.json not found: the select stage has not run yet."
        return
    data.capabilities = CapabilitiesFile.read(path)


def _read_calibration(ws: Path, data: ReportData) -> None:
    for path in sorted((ws / "envs").glob("*/calibration.json")):
        data.calibration[path.parent.name] = CalibrationResult.read(path)
    if not data.calibration:
        data.missing["calibration"] = "no envs/<capability>/calibration.json: the synthesize stage has not run yet."


def _read_training(ws: Path, data: ReportData) -> None:
    for path in sorted((ws / "adapters").glob("*/metrics.jsonl")):
        curve = _read_curve(ws, path, path.parent.name)
        if curve is not None:
            data.training[curve.name] = curve
    if not data.training:
        data.missing["training"] = "no adapters/<capability>/metrics.jsonl: the train stage has not run yet."
    grpo = ws / "baselines" / "grpo_target" / "metrics.jsonl"
    if grpo.is_file():
        data.grpo_training = _read_curve(ws, grpo, "grpo_target")
    swe_rl = ws / "baselines" / "swe_rl" / "metrics.jsonl"
    if swe_rl.is_file():
        data.swe_rl_training = _read_curve(ws, swe_rl, "swe_rl")


def _read_curve(ws: Path, path: Path, name: str) -> TrainingCurve | None:
    rows = read_metrics(path)
    if not rows:
        return None
    return TrainingCurve(name=name, source=str(path.relative_to(ws)), rows=sorted(rows, key=lambda r: r.step))


def _read_evaluation(ws: Path, data: ReportData) -> None:
    found: dict[str, EvalResult] = {}
    for path in sorted((ws / "eval").glob("*.json")):
        e = EvalResult.read(path)
        if eval_file_stem(e.variant) != path.stem:
            raise InputError(f"variant {e.variant!r} does not match the file name "
                             f"(expected {eval_file_stem(e.variant)}.json)", path=str(path))
        found[e.variant] = e
    data.evaluation = {name: found[name] for name in sorted(found, key=variant_sort_key)}
    if not data.evaluation:
        data.missing["evaluation"] = "no eval/<variant>.json: the eval stage has not run yet."
        return
    if data.gepa_on and "gepa" not in data.evaluation and not Workspace(ws).gepa_result.is_file():
        data.missing["gepa"] = GEPA_NOT_RUN
    data.trace_variant = next((m.variant for m in COMPOSITION_MODES.values() if m.variant in data.evaluation), None)
    trace = data.evaluation.get(data.trace_variant) if data.trace_variant else None
    grpo = data.evaluation.get("grpo_target")
    if trace and grpo and set(trace.per_task) & set(grpo.per_task):
        data.trace_vs_grpo = paired_difference(trace.per_task, grpo.per_task, seed=0)
    swe_rl = data.evaluation.get("swe_rl")
    if trace and swe_rl and set(trace.per_task) & set(swe_rl.per_task):
        data.trace_vs_swe_rl = paired_difference(trace.per_task, swe_rl.per_task, seed=0)


def _read_composition(ws: Path, data: ReportData) -> None:
    path = ws / "composed" / "composition.json"
    if not path.is_file():
        data.missing["composition"] = "composed/composition.json not found: the compose stage has not run yet."
        return
    data.composition = CompositionSpec.read(path)
    accuracy = data.composition.routing_accuracy
    if accuracy is not None:
        data.routing_accuracy = accuracy.overall
        data.routing_accuracy_by_capability = dict(accuracy.per_capability)


def _read_sample_efficiency(ws: Path, data: ReportData) -> None:
    """TRACE and GRPO on the target at each budget they were evaluated at, on the same validation episodes:
    TRACE's curve points (curve/curve.json: the composition of the adapters' snapshots, step by step) and
    GRPO-on-target's eval_success rows (baselines/grpo_target/metrics.jsonl), with the base on those
    episodes (step 0: nothing trained yet); beside them, each one's pass^1 on the test tasks at its final
    budget (eval/<variant>.json). Each method's best validation checkpoint is set against its last."""
    curve_path = ws / "curve" / "curve.json"
    curve = TraceCurve.read(curve_path) if curve_path.is_file() else None
    notes = []
    if curve is not None and data.trace_variant is not None and curve.variant != data.trace_variant:
        notes.append(f"curve/curve.json measures {curve.variant}, not {data.trace_variant}")
        curve = None  # the curve of a composition the report does not show as TRACE
    elif curve is None:
        notes.append("TRACE: curve/curve.json not written yet")
    elif curve.note:
        notes.append(f"TRACE: {curve.note}")
    trace = [EfficiencyPoint(step=p.step, rollouts=p.rollouts, passed=p.passed, episodes=p.episodes,
                             interval=wilson_interval(p.passed, p.episodes)) for p in curve.points] if curve else []
    grpo, swe_rl = _validation_points(data.grpo_training), _validation_points(data.swe_rl_training)
    if data.grpo_training is not None and not grpo:
        notes.append("GRPO on the target logged no validation episodes")
    if data.swe_rl_training is not None and not swe_rl:
        notes.append("SWE-RL logged no validation episodes")
    if not trace and not grpo:
        data.missing["sample_efficiency"] = "; ".join(notes) or "no curve measured yet"
        return
    base = next((p for p in grpo + trace if p.step == 0), None)
    tests = {v: e for v in ("base", data.trace_variant, "grpo_target", "swe_rl", "gepa")
             if v and (e := data.evaluation.get(v))}
    episodes = (grpo or trace)[0].episodes
    start = curve.eval_seed_start if curve else None
    where = f" (seeds {start}–{start + episodes - 1})" if start is not None else ""
    data.sample_efficiency = SampleEfficiency(
        episodes=f"{episodes} held-out tasks of the target's train split{where}, greedy, none of them trained on",
        base=base, trace=trace, grpo_target=grpo, swe_rl=swe_rl,
        best={name: best_checkpoint(points) for name, points in (("trace", trace), ("grpo_target", grpo),
                                                                  ("swe_rl", swe_rl)) if points},
        test={v: e.pass1 for v, e in tests.items()}, test_tasks=max((e.n_tasks for e in tests.values()), default=0),
        note="; ".join(notes) or None)


def _validation_points(curve: TrainingCurve | None) -> list[EfficiencyPoint]:
    """A GRPO baseline's checkpoints on the validation episodes (its metrics' eval_success rows)."""
    points = []
    for r in curve.rows if curve is not None else []:
        if r.eval_success is not None and r.eval_episodes:
            passed = round(r.eval_success * r.eval_episodes)
            points.append(EfficiencyPoint(step=r.step, rollouts=r.rollouts_used, passed=passed, episodes=r.eval_episodes,
                                          interval=wilson_interval(passed, r.eval_episodes)))
    return points


def best_checkpoint(points: list[EfficiencyPoint]) -> BestCheckpoint:
    """The earliest step of the highest validation success, against the last step."""
    best = max(points, key=lambda p: (p.interval.mean, -p.step))
    last = points[-1]
    return BestCheckpoint(step=best.step, success=best.interval.mean, last_step=last.step,
                          last_success=last.interval.mean)


def _read_examples(ws: Path, data: ReportData) -> None:
    base_path = ws / "eval" / "base.jsonl"
    trace_path = ws / "eval" / f"{eval_file_stem(data.trace_variant)}.jsonl" if data.trace_variant else None
    if not base_path.is_file() or trace_path is None or not trace_path.is_file():
        data.missing["examples"] = ("needs eval/base.jsonl and eval/trace_moe.jsonl (or trace_router.jsonl): "
                                    "the eval stage has not written test trajectories yet.")
        return
    base = _first_per_task(read_jsonl(base_path, Trajectory))
    trace = _first_per_task(read_jsonl(trace_path, Trajectory))
    data.examples = [Example(task_id=t, base=base[t], trace=trace[t]) for t in pick_examples(base, trace)]
    if not data.examples:
        data.missing["examples"] = "base and TRACE test trajectories share no task."


def pick_examples(base: dict[str, Trajectory], trace: dict[str, Trajectory], n: int = EXAMPLES_SHOWN) -> list[str]:
    """Task ids to show: first where base failed and TRACE passed, then other disagreements, then any."""
    common = sorted(set(base) & set(trace), key=natural_key)

    def rank(task: str) -> int:
        b, t = base[task].passed, trace[task].passed
        return 0 if (not b and t) else 1 if b != t else 2

    return sorted(common, key=rank)[:n]  # sorted() is stable: natural order within each rank


def _first_per_task(trajectories: list[Trajectory]) -> dict[str, Trajectory]:
    out: dict[str, Trajectory] = {}
    for t in trajectories:
        out.setdefault(t.task_id, t)
    return out


# ----------------------------------------------------------------------------- helpers


def variant_sort_key(variant: str) -> tuple[int, str]:
    for i, prefix in enumerate(VARIANT_ORDER):
        if variant == prefix or (prefix.endswith(":") and variant.startswith(prefix)):
            return (i, variant)
    return (len(VARIANT_ORDER), variant)


def natural_key(text: str) -> list[Any]:
    """Sort key with numbers compared as numbers: task_2 before task_10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part]


def _outcome(t: Trajectory) -> Outcome:
    return Outcome(passed=t.passed, reward=t.reward, termination=t.termination)
