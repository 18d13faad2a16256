"""The report's data: read a workspace's stage outputs into one `ReportData`, validating every file.

Each stage writes its own files (layout in DESIGN.md); this module reads whatever exists. A stage
that has not run yet leaves its section empty (`ReportData.missing` says why); a file that exists
but is malformed raises `InputError` naming the file (and line, for JSONL). Nothing here writes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error, read_json, read_jsonl
from tracerl.core.trajectory import Trajectory
from tracerl.evaluation.stats import Interval, paired_difference

# Display order of the evaluation variants; `adapter:<capability>` ones go after the baselines.
VARIANT_ORDER = ("base", "prompt_capabilities", "grpo_target", "adapter:", "trace_router", "trace_moe")
TRACE_VARIANTS = ("trace_moe", "trace_router")  # the first present is "TRACE" in the headline
EXAMPLES_SHOWN = 2
ROUTING_META_KEYS = ("overall", "per_capability", "num_prompts", "method")


# ----------------------------------------------------------------------------- input file models


class _Lenient(BaseModel):
    """Input records: the documented fields are checked, extra fields are kept (stages may add more)."""

    model_config = ConfigDict(extra="allow")


class FailedExample(BaseModel):
    task_id: str
    evidence: str | None = None


class CapabilityRecord(_Lenient):
    """One row of capabilities.json (step 1's output). Means are None where a run had no data (NaN)."""

    name: str
    description: str = ""
    selected: bool
    decoy: bool | None = None
    mean_cov: float | None
    std_cov: float | None = None
    mean_delta: float | None
    std_delta: float | None = None
    cov_ci: tuple[float | None, float | None] | None = Field(None, validation_alias=AliasChoices("cov_ci", "cov_ci95"))
    delta_ci: tuple[float | None, float | None] | None = Field(
        None, validation_alias=AliasChoices("delta_ci", "delta_ci95"))
    runs_passed: int
    runs_total: int
    er_plus_zero: bool | None = Field(None, validation_alias=AliasChoices("er_plus_zero", "er_plus_flag"))
    example_failed: list[FailedExample] = Field(default_factory=list)

    @field_validator("example_failed", mode="before")
    @classmethod
    def _task_ids_or_records(cls, value: Any) -> Any:
        """Plain task ids, or selection's records ({task_id, evidence, …})."""
        if isinstance(value, list):
            return [{"task_id": v} if isinstance(v, str) else v for v in value]
        return value


class CapabilitiesFile(_Lenient):
    params: dict[str, float] = Field(default_factory=dict)  # rho, delta, k, n
    totals: dict[str, int] = Field(default_factory=dict)  # failed, passed
    capabilities: list[CapabilityRecord]


class CalibrationFile(_Lenient):
    """envs/<capability>/calibration.json: every field optional, the report shows what is there.

    The statistics may sit at the top level or under `stats` (synthesis's CalibrationResult);
    `bands` are the acceptance bands when the file carries them.
    """

    accepted: bool | None = None
    rounds: list[Any] = Field(default_factory=list)
    difficulty: int | None = None
    mean_reward: float | None = None
    success_rate: float | None = None
    reward_std: float | None = None
    all_success: float | None = None
    all_zero: float | None = None
    constant: float | None = None
    informative: float | None = None
    pass_at_k: dict[str, float] = Field(default_factory=dict)
    stop_reason: str | None = None
    bands: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _lift_stats(cls, value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("stats"), dict):
            value = {**value["stats"], **{k: v for k, v in value.items() if k != "stats"}}
        return value

    @field_validator("pass_at_k")
    @classmethod
    def _k_are_integers(cls, value: dict[str, float]) -> dict[str, float]:
        for k in value:
            if not k.isdigit() or int(k) < 1:
                raise ValueError(f"pass_at_k key {k!r} is not a positive integer")
        return dict(sorted(value.items(), key=lambda kv: int(kv[0])))

    def round_path(self) -> list[tuple[int | None, bool | None]]:
        """(difficulty, accepted) of each round whose record says so."""
        return [(r.get("difficulty"), r.get("accepted")) for r in self.rounds if isinstance(r, dict)]

    def band(self, name: str) -> tuple[float, float] | None:
        value = (self.bands or {}).get(name)
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_number(v) for v in value):
            return (float(value[0]), float(value[1]))
        return None


class MetricsRow(_Lenient):
    """One line of adapters/<capability>/metrics.jsonl or baselines/grpo_target/metrics.jsonl."""

    step: int
    rollouts: int = Field(validation_alias=AliasChoices("rollouts", "rollouts_used"))  # consumed so far
    reward_mean: float | None = None
    success_rate: float | None = None
    eval_success: float | None = None  # held-out success, on evaluation steps only
    loss: float | None = None
    seconds: float | None = None


class EvalFile(_Lenient):
    """eval/<variant>.json (the eval runner's output for one variant)."""

    variant: str
    pass1: Interval
    pass_k: dict[str, float] = Field(default_factory=dict)
    diff_vs_base: Interval | None = None
    rollouts_used: int
    n_tasks: int | None = None
    failures_by_capability: dict[str, int] = Field(default_factory=dict)
    per_task: dict[str, float] = Field(default_factory=dict)

    @field_validator("pass1")
    @classmethod
    def _rate_in_unit_interval(cls, value: Interval) -> Interval:
        if not all(0.0 <= x <= 1.0 for x in (value.mean, value.low, value.high)):
            raise ValueError("pass rates must lie in [0, 1]")
        return value


class SampleEfficiencyFile(_Lenient):
    trace: list[tuple[float, float]] = Field(default_factory=list)
    grpo_target: list[tuple[float, float]] = Field(default_factory=list)


# ----------------------------------------------------------------------------- the assembled report


class TrainingCurve(BaseModel):
    """One adapter's (or the GRPO-on-target baseline's) training metrics."""

    name: str
    source: str  # the metrics.jsonl path, relative to the workspace
    rows: list[MetricsRow]

    def final(self) -> dict[str, Any]:
        """The last row's figures plus the last held-out success seen."""
        last = self.rows[-1]
        evals = [r for r in self.rows if r.eval_success is not None]
        return {
            "steps": last.step,
            "rollouts": last.rollouts,
            "reward_mean": last.reward_mean,
            "success_rate": last.success_rate,
            "eval_success": evals[-1].eval_success if evals else None,
            "eval_success_start": evals[0].eval_success if evals else None,
        }


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
    calibration: dict[str, CalibrationFile] = Field(default_factory=dict)
    training: dict[str, TrainingCurve] = Field(default_factory=dict)  # capability → curve
    trained_rejected: list[str] = Field(default_factory=list)  # adapters trained on an environment calibration rejected
    grpo_training: TrainingCurve | None = None
    evaluation: dict[str, EvalFile] = Field(default_factory=dict)  # variant → figures, display order
    composition: dict[str, Any] | None = None
    routing_accuracy: float | None = None
    routing_accuracy_by_capability: dict[str, float] = Field(default_factory=dict)
    sample_efficiency: dict[str, Any] | None = None  # {"source", "trace", "grpo_target", "adapters"}
    trace_variant: str | None = None
    trace_vs_grpo: Interval | None = None  # paired difference over tasks, TRACE − GRPO-on-target
    examples: list[Example] = Field(default_factory=list)
    missing: dict[str, str] = Field(default_factory=dict)  # section → why it is empty

    def summary(self) -> dict[str, Any]:
        """report.json: every figure the page shows (conversations summarised by outcome)."""
        evaluation = {
            name: {
                "pass1": e.pass1.model_dump(),
                "pass_k": e.pass_k,
                "diff_vs_base": e.diff_vs_base.model_dump() if e.diff_vs_base else None,
                "rollouts_used": e.rollouts_used,
                "n_tasks": e.n_tasks if e.n_tasks is not None else len(e.per_task),
                "failures_by_capability": e.failures_by_capability,
            }
            for name, e in self.evaluation.items()
        }
        return {
            "workspace": self.workspace,
            "headline": self.headline(),
            "base_rollouts": self.base_rollouts,
            "capabilities": self.capabilities.model_dump() if self.capabilities else None,
            "calibration": {name: c.model_dump() for name, c in self.calibration.items()},
            "trained_rejected": self.trained_rejected,
            "training": {
                name: {"source": c.source, "final": c.final(), "rows": [r.model_dump() for r in c.rows]}
                for name, c in self._all_curves().items()
            },
            "evaluation": evaluation,
            "routing_accuracy": self.routing_accuracy,
            "routing_accuracy_by_capability": self.routing_accuracy_by_capability,
            "composition": self.composition,
            "sample_efficiency": self.sample_efficiency,
            "examples": [
                {
                    "task_id": ex.task_id,
                    "base": {"passed": ex.base.passed, "reward": ex.base.reward, "termination": ex.base.termination},
                    "trace": {"passed": ex.trace.passed, "reward": ex.trace.reward, "termination": ex.trace.termination},
                }
                for ex in self.examples
            ],
            "missing": self.missing,
        }

    def headline(self) -> dict[str, Any]:
        """TRACE vs base vs GRPO-on-target (and the prompting baseline), with intervals."""

        def entry(variant: str | None) -> dict[str, Any] | None:
            e = self.evaluation.get(variant) if variant else None
            if e is None:
                return None
            return {
                "variant": variant,
                "pass1": e.pass1.model_dump(),
                "diff_vs_base": e.diff_vs_base.model_dump() if e.diff_vs_base else None,
                "rollouts_used": e.rollouts_used,
            }

        return {
            "trace": entry(self.trace_variant),
            "base": entry("base"),
            "grpo_target": entry("grpo_target"),
            "prompt_capabilities": entry("prompt_capabilities"),
            "trace_vs_grpo_target": self.trace_vs_grpo.model_dump() if self.trace_vs_grpo else None,
            "routing_accuracy": self.routing_accuracy,
        }

    def _all_curves(self) -> dict[str, TrainingCurve]:
        curves = dict(self.training)
        if self.grpo_training is not None:
            curves["grpo_target"] = self.grpo_training
        return curves


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
        yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(f"not valid YAML ({getattr(e, 'problem', e)})", path=str(path),
                         line=mark.line + 1 if mark else None) from None
    data.config_text = text


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
    data.capabilities = _validate(path, CapabilitiesFile)


def _read_calibration(ws: Path, data: ReportData) -> None:
    for path in sorted((ws / "envs").glob("*/calibration.json")):
        data.calibration[path.parent.name] = _validate(path, CalibrationFile)
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


def _read_curve(ws: Path, path: Path, name: str) -> TrainingCurve | None:
    rows = read_jsonl(path, MetricsRow)
    if not rows:
        return None
    return TrainingCurve(name=name, source=str(path.relative_to(ws)), rows=sorted(rows, key=lambda r: r.step))


def _read_evaluation(ws: Path, data: ReportData) -> None:
    found: dict[str, EvalFile] = {}
    for path in sorted((ws / "eval").glob("*.json")):
        if path.name == "sample_efficiency.json":
            continue
        e = _validate(path, EvalFile)
        if variant_file_stem(e.variant) != path.stem:
            raise InputError(f"variant {e.variant!r} does not match the file name "
                             f"(expected {variant_file_stem(e.variant)}.json)", path=str(path))
        found[e.variant] = e
    data.evaluation = {name: found[name] for name in sorted(found, key=variant_sort_key)}
    if not data.evaluation:
        data.missing["evaluation"] = "no eval/<variant>.json: the eval stage has not run yet."
        return
    data.trace_variant = next((v for v in TRACE_VARIANTS if v in data.evaluation), None)
    trace = data.evaluation.get(data.trace_variant) if data.trace_variant else None
    grpo = data.evaluation.get("grpo_target")
    if trace and grpo and set(trace.per_task) & set(grpo.per_task):
        data.trace_vs_grpo = paired_difference(trace.per_task, grpo.per_task, seed=0)


def _read_composition(ws: Path, data: ReportData) -> None:
    path = ws / "composed" / "composition.json"
    if not path.is_file():
        data.missing["composition"] = "composed/composition.json not found: the compose stage has not run yet."
        return
    value = read_json(path)
    if not isinstance(value, dict):
        raise InputError("expected a JSON object", path=str(path))
    data.composition = value
    accuracy = value.get("routing_accuracy")
    bad = InputError("routing_accuracy must be a number, or an object with a numeric 'overall' and "
                     "per-capability numbers (flat or under 'per_capability')", path=str(path))
    if accuracy is None:
        return
    if _is_number(accuracy):
        data.routing_accuracy = float(accuracy)
        return
    if not isinstance(accuracy, dict) or not (accuracy.get("overall") is None or _is_number(accuracy["overall"])):
        raise bad
    per = accuracy.get("per_capability")
    if per is None:  # the flat form: {capability: accuracy, …, "overall": accuracy}
        per = {k: v for k, v in accuracy.items() if k not in ROUTING_META_KEYS}
    if not isinstance(per, dict) or not all(_is_number(v) for v in per.values()):
        raise bad
    data.routing_accuracy = None if accuracy.get("overall") is None else float(accuracy["overall"])
    data.routing_accuracy_by_capability = {k: float(v) for k, v in per.items()}


def _read_sample_efficiency(ws: Path, data: ReportData) -> None:
    """From eval/sample_efficiency.json when present, else derived from the variants and GRPO metrics."""
    adapters = sorted(
        ([e.rollouts_used, e.pass1.mean] for v, e in data.evaluation.items() if v.startswith("adapter:")),
    )
    path = ws / "eval" / "sample_efficiency.json"
    if path.is_file():
        f = _validate(path, SampleEfficiencyFile)
        data.sample_efficiency = {
            "source": "eval/sample_efficiency.json",
            "trace": sorted([list(p) for p in f.trace]),
            "grpo_target": sorted([list(p) for p in f.grpo_target]),
            "adapters": adapters,
        }
        return
    base = data.evaluation.get("base")
    trace = data.evaluation.get(data.trace_variant) if data.trace_variant else None
    grpo = data.evaluation.get("grpo_target")
    trace_points: list[list[float]] = []
    grpo_points: list[list[float]] = []
    if trace is not None:
        trace_points = ([[0, base.pass1.mean]] if base else []) + [[trace.rollouts_used, trace.pass1.mean]]
    if data.grpo_training is not None:
        grpo_points = [[r.rollouts, r.eval_success] for r in data.grpo_training.rows if r.eval_success is not None]
    if grpo is not None:
        grpo_points = [p for p in grpo_points if p[0] != grpo.rollouts_used] + [[grpo.rollouts_used, grpo.pass1.mean]]
    if grpo_points and base is not None and all(p[0] != 0 for p in grpo_points):
        grpo_points.insert(0, [0, base.pass1.mean])
    if not trace_points and not grpo_points:
        data.missing["sample_efficiency"] = ("no TRACE or GRPO-on-target results yet (eval stage) and no "
                                             "eval/sample_efficiency.json.")
        return
    data.sample_efficiency = {
        "source": "derived: pass^1 and rollouts_used of the eval variants, GRPO-on-target's eval_success rows",
        "trace": sorted(trace_points),
        "grpo_target": sorted(grpo_points),
        "adapters": adapters,
    }


def _read_examples(ws: Path, data: ReportData) -> None:
    base_path = ws / "eval" / "base.jsonl"
    trace_path = ws / "eval" / f"{variant_file_stem(data.trace_variant)}.jsonl" if data.trace_variant else None
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


def variant_file_stem(variant: str) -> str:
    """eval/<stem>.json of a variant: ':' becomes '-' (`adapter:x` → `adapter-x`)."""
    return variant.replace(":", "-")


def variant_sort_key(variant: str) -> tuple[int, str]:
    for i, prefix in enumerate(VARIANT_ORDER):
        if variant == prefix or (prefix.endswith(":") and variant.startswith(prefix)):
            return (i, variant)
    return (len(VARIANT_ORDER), variant)


def natural_key(text: str) -> list[Any]:
    """Sort key with numbers compared as numbers: task_2 before task_10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part]


def _validate(path: Path, model: type[BaseModel]) -> Any:
    value = read_json(path)
    try:
        return model.model_validate(value)
    except ValidationError as e:
        raise InputError(describe_validation_error(e), path=str(path)) from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
