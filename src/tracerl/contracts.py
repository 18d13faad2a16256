"""The files passed between stages: one pydantic model each, written and read only through it.

    rollouts/*.jsonl, eval/*.jsonl         Trajectory (`tracerl.core.trajectory`), one per line
    capabilities.json                      CapabilitiesFile — step 1, `tracerl select`
    labels/run_XX.json                     LabelRun — its labelling runs
    envs/index.json                        EnvIndex — step 2, `tracerl synthesize`
      envs/<c>/env.json                    EnvSpec (the directory: `envs.synthetic.envdir`)
      envs/<c>/target.json                 TargetFile (the in-memory `envs.synthetic.target.Target`)
      envs/<c>/checks.json                 CheckReport
      envs/<c>/calibration.json            CalibrationResult (`synthesis.calibration` computes it)
    adapters/<c>/train_config.json         TrainRun — step 3, `tracerl train`
    adapters/<c>/metrics.jsonl             MetricsRow, one per line
    gate_data/summary.json                 GateData — step 4 (the pipeline)
    composed*/composition.json             CompositionSpec — step 4, `tracerl compose`
    eval/<variant>.json                    EvalResult — `tracerl eval`
    curve/curve.json                       TraceCurve — TRACE's sample-efficiency points (the pipeline)
    baselines/gepa/result.json             PromptOptimization — GEPA's system prompt (the pipeline)
    report/report.json                     ReportSummary — `tracerl report`

`Workspace` names every one of these paths in a run's folder; nothing else spells them out.

Every model here forbids fields it does not know, so a writer and a reader cannot drift apart:
`Model.read(path)` raises the one-line `InputError` naming the file, `model.write(path)` writes
atomically. This module imports no torch (`tracerl report` and `tracerl select` use it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar


from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tracerl.core.config_file import parse_yaml
from tracerl.core.errors import InputError
from tracerl.core.io import (
    atomic_write_text,
    describe_validation_error,
    parse_json,
    read_json,
    read_jsonl,
    read_text,
)

C = TypeVar("C", bound="Contract")
CAPABILITY_NAME = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")


class Record(BaseModel):
    """A part of a contract file: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


class Interval(Record):
    """A mean and its 95% interval (`tracerl.evaluation.stats` computes them)."""

    mean: float
    low: float
    high: float


class Contract(Record):
    """A whole file passed between stages."""

    @classmethod
    def read(cls: type[C], path: str | Path) -> C:
        """The file's content; `InputError` (one line, naming the file) when it is missing or does not fit."""
        value = read_json(path)
        if not isinstance(value, dict):
            raise InputError(f"expected a JSON object ({cls.__name__}), got {type(value).__name__}", path=str(path))
        try:
            return cls.model_validate(value)
        except ValidationError as e:
            raise InputError(describe_validation_error(e), path=str(path)) from None

    def write(self, path: str | Path) -> None:
        """Write the file atomically (keys in field order: the same content gives the same bytes)."""
        atomic_write_text(path, json.dumps(self.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------- capabilities (step 1)


class Rubric(Record):
    na: str = Field(description="When the task does not need the capability.")
    present: str = Field(description="Needed, and the agent exercised it.")
    lacking: str = Field(description="Needed, and the agent did not.")


def default_rubric(description: str) -> Rubric:
    """A generic rubric for a capability known only by its description."""
    return Rubric(
        na=f"The task does not call for this: {description}",
        present="The task called for it and the agent did it.",
        lacking="The task called for it and the agent failed to do it.",
    )


class Capability(Record):
    """What a capability is: selection labels with it, synthesis builds an environment for it,
    composition gives it an adapter slot, the report shows it."""

    name: str = Field(description="snake_case identifier; also the adapter's and the environment's name.")
    description: str = Field("", description="What the agent does when it has the capability.")
    rubric: Rubric = Field(description="What NA, PRESENT and LACKING mean for it (generic when not given).")
    decoy: bool = Field(False, description="A capability a good labeller never selects (keeps selection honest).")
    source: Literal["builtin", "user", "discovered"] = Field("builtin", description="Where it came from.")
    example_task_ids: list[str] = Field(default_factory=list, description="Tasks discovery saw it in.")

    @model_validator(mode="before")
    @classmethod
    def _rubric_from_description(cls, value: Any) -> Any:
        if isinstance(value, dict) and "rubric" not in value and isinstance(value.get("description", ""), str):
            value = {**value, "rubric": default_rubric(value.get("description", "")).model_dump()}
        return value

    @field_validator("name")
    @classmethod
    def _snake_case(cls, v: str) -> str:
        if not CAPABILITY_NAME.match(v):
            raise ValueError(f"capability name '{v}' is not snake_case")
        return v


class RunFigures(Record):
    """One labelling run's counts and rates for one capability (L/P/N: LACKING/PRESENT/NA; F/P: failed/passed)."""

    run: int
    LF: int
    PF: int
    NF: int
    LP: int
    PP: int
    NP: int
    cov: float | None = Field(description="Cov = LF / (LF + PF + NF): share of failed trajectories lacking it.")
    er_minus: float | None = Field(description="ER− = LF / (LF + PF); 0 when no failed trajectory needs it (TRACE).")
    er_plus: float | None = Field(description="ER+ = LP / (LP + PP); 0 when no passed trajectory needs it (TRACE).")
    delta: float | None = Field(description="Δ = ER− − ER+.")
    passed: bool = Field(description="Cov ≥ ρ and Δ ≥ δ in this run.")


class FailedExample(Record):
    index: int = Field(description="The trajectory's position in the rollouts file.")
    task_id: str
    lacking_runs: int = Field(description="Runs that labelled it LACKING.")
    evidence: str = Field(description="The labeller's evidence, from the first such run.")


class CapabilityResult(Capability):
    """One row of capabilities.json: the capability and its selection figures. Means over runs,
    standard deviations population (ddof 0); None stands for NaN."""

    selected: bool
    rank: int = Field(description="1 = first: selected ones first, then by mean Δ.")
    status: Literal["PENDING"] | None = Field(description="PENDING for a selected capability, else None.")
    note: str | None = Field(None, description="Why a capability that passed is not selected (select.max_selected).")
    mean_cov: float | None
    std_cov: float | None
    cov_ci95: tuple[float | None, float | None] = Field(description="95% bootstrap interval of Cov over trajectories.")
    mean_delta: float | None
    std_delta: float | None
    delta_ci95: tuple[float | None, float | None] = Field(description="95% bootstrap interval of Δ.")
    mean_er_minus: float | None
    mean_er_plus: float | None
    runs_passed: int
    runs_total: int
    er_plus_empty_runs: int = Field(description="Runs where no passed trajectory needed it (LP + PP = 0, ER+ taken as 0).")
    er_plus_flag: bool = Field(description="er_plus_empty_runs > 0: Δ rests on ER− alone in some run.")
    unlabelled_pairs: int = Field(description="(trajectory, capability) pairs the labeller left unlabelled.")
    per_run: list[RunFigures]
    example_failed: list[FailedExample]

    def definition(self) -> Capability:
        return Capability.model_validate(self.model_dump(include=set(Capability.model_fields)))


class SelectionSettings(Record):
    rho: float = Field(description="ρ: minimum coverage.")
    delta: float = Field(description="δ: minimum contrastive gap.")
    k: int = Field(description="K: runs a capability must pass.")
    n: int = Field(description="N: labelling runs.")
    bootstrap: int = Field(description="Bootstrap resamples of the intervals.")
    seed: int


class Totals(Record):
    trajectories: int
    failed: int
    passed: int


class LabelerInfo(Record):
    name: str
    deterministic: bool
    note: str


class CapabilitiesFile(Contract):
    """capabilities.json: every candidate capability with its figures, ranked."""

    params: SelectionSettings
    totals: Totals
    labeler: LabelerInfo
    unlabelled_pairs: int
    capabilities: list[CapabilityResult]

    def selected(self) -> list[CapabilityResult]:
        return [c for c in self.capabilities if c.selected]


# ----------------------------------------------------------------------------- labels (step 1)


Label = Literal["NA", "PRESENT", "LACKING"]
def load_capabilities(path: str | Path) -> list[Capability]:
    """Users' capabilities from a YAML or JSON file: a list of {name, description, rubric{na,present,lacking}}
    (or a mapping with a `capabilities` list). A missing rubric gets one written from the description."""
    path = Path(path)
    text = read_text(path)
    data = parse_json(text, path) if path.suffix == ".json" else parse_yaml(text, path)
    if isinstance(data, dict) and "capabilities" in data:
        data = data["capabilities"]
    if not isinstance(data, list):
        raise InputError("expected a list of capabilities (or a mapping with a 'capabilities' list)", path=str(path))
    out = []
    for i, entry in enumerate(data):
        try:
            cap = Capability.model_validate({"source": "user", **entry} if isinstance(entry, dict) else entry)
        except ValidationError as e:
            raise InputError(f"capability {i}: {describe_validation_error(e)}", path=str(path)) from None
        out.append(cap)
    return out


def read_capability_list(path: str | Path) -> list[Capability]:
    """The capabilities to build environments for: those selected in a capabilities.json (`tracerl select`),
    or every one of a hand-written list (`load_capabilities`: names and descriptions, for a user who
    already knows the agent's gaps)."""
    path = Path(path)
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # ValueError: JSON or UTF-8 broken
            data = None  # load_capabilities says what is wrong
        entries = data.get("capabilities") if isinstance(data, dict) else None
        results = isinstance(entries, list) and any(isinstance(e, dict) and {"selected", "rank"} & set(e) for e in entries)
        if isinstance(data, dict) and ({"params", "totals", "labeler", "unlabelled_pairs"} & set(data) or results):
            return list(CapabilitiesFile.read(path).selected())  # selection's file: its errors name its fields
    return load_capabilities(path)


LABELS: tuple[Label, ...] = ("NA", "PRESENT", "LACKING")


class PairLabel(Record):
    label: Label | None  # None: unlabelled (reported, excluded from counts)
    evidence: str = ""


class TrajectoryLabels(Record):
    index: int
    task_id: str
    passed: bool
    labels: dict[str, PairLabel]


class LabelRun(Contract):
    """labels/run_XX.json: one labelling run's label for every (trajectory, capability) pair."""

    run: int
    seed: int
    labeler: str
    capabilities: list[str]
    trajectories: list[TrajectoryLabels]
    unlabelled: int = 0
    problems: list[str] = Field(default_factory=list)


def lacking_capabilities(runs: list[LabelRun], names: list[str], k: int) -> dict[str, list[str]]:
    """Each failed trajectory's task id → the capabilities of `names` (in that order) that at least `k`
    of the runs labelled LACKING — TRACE's K-of-N, per trajectory."""
    if not runs:
        return {}
    counts: dict[tuple[int, str], int] = {}
    for run in runs:
        for t, row in enumerate(run.trajectories):
            for name, pair in row.labels.items():
                counts[t, name] = counts.get((t, name), 0) + (pair.label == "LACKING")
    return {row.task_id: [n for n in names if counts.get((t, n), 0) >= k]
            for t, row in enumerate(runs[0].trajectories) if not row.passed}


# ----------------------------------------------------------------------------- environments (step 2)


class EnvSpec(Contract):
    """envs/<c>/env.json: how to rebuild the environment — a template or an LLM-written module — and at what difficulty."""

    capability: str
    description: str = ""
    source: Literal["template", "llm"] = "template"
    template: str | None = Field(None, description="A key of tracerl.envs.synthetic.templates.TEMPLATES, or of a "
                                 "built-in domain's own capability environments (tracerl.envs.registry.capability_envs).")
    module: str | None = Field(None, description="A file in the directory defining make_env(difficulty).")
    target: str = Field(description="The target's name ('airline', 'retail', …).")
    difficulty: int = 1
    hint_fraction: float = Field(0.25, description="Share of a GRPO group sampled with the hint (TRACE: 0.25–0.5).")
    max_turns: int | None = None

    @model_validator(mode="after")
    def _one_recipe(self) -> EnvSpec:
        if (self.template is None) == (self.module is None):
            raise ValueError("exactly one of 'template' and 'module' must be set")
        return self


class TargetFile(Contract):
    """envs/<c>/target.json: the target domain the environment imitates (`envs.synthetic.target.Target`), so
    the directory does not depend on where the target's tools.json was."""

    name: str
    title: str = Field(description="The first line of the target's system prompt.")
    source: str = Field(description="'airline' (built in) or the tools.json it was read from.")
    preamble: list[str]
    closing: list[str]
    value_examples: dict[str, list[Any]] = Field(description="Parameter → values the target uses.")
    result_examples: dict[str, dict[str, Any]] = Field(description="Tool → one JSON object it returned.")
    request_examples: dict[str, list[dict[str, Any]]] = Field(
        default_factory=dict, description='Write tool → [{"request": the target user\'s words, values as "{parameter}", '
                                          '"record": the record it was made on, "user": the user\'s fields, "allowed": '
                                          'whether its rules allowed it, "write": the write that serves it}].')
    rules: list[str] = Field(default_factory=list, description="The target's domain rule lines.")
    policy: str = Field("", description="The domain's policy text (`target.policy`, or the environment's system "
                        "prompt); the LLM environment writer is given it.")
    tools: list[dict[str, Any]] = Field(description="OpenAI function schemas, each with its 'x-tool-type'.")



class CheckResult(Record):
    name: str
    passed: bool
    detail: str = ""


class CheckReport(Contract):
    """envs/<c>/checks.json: the requirement checks the environment passed (`synthesis.checks`)."""

    checks: list[CheckResult]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def get(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def failures(self) -> str:
        """One line per failed check: what to fix."""
        return "\n".join(f"{c.name}: {c.detail}" for c in self.checks if not c.passed)


class EnvCalibration(Record):
    """calibration.json's outcome in short (the file itself: `CalibrationResult`)."""

    accepted: bool = Field(description="Within TRACE's bands at `difficulty`.")
    difficulty: int = Field(description="The accepted difficulty, or the last one tried.")
    success_rate: float = Field(description="The base policy's success rate there.")
    without_signal: bool = Field(False, description="Every group's rewards were equal there "
                                 "(`CalibrationStats.without_signal`): no GRPO signal.")
    stop_reason: str


class EnvRecord(Record):
    """What synthesis did for one selected capability."""

    capability: str
    status: Literal["DONE", "FAILED"]
    environment: str | None = Field(description="The env directory, relative to the index's folder; None when none was built.")
    source: str = Field(description="template, llm, or - (nothing built).")
    error: str | None = None
    calibration: EnvCalibration | None = Field(None, description="None when not calibrated.")


class EnvIndex(Contract):
    """envs/index.json: the environments synthesis built (`built`, in selection order) and why the others are missing."""

    target: str
    generator: Literal["template", "llm"]
    environments: list[EnvRecord]

    def built(self) -> list[str]:
        return [e.capability for e in self.environments if e.status == "DONE"]

    def trainable(self, skip_without_signal: bool) -> list[str]:
        """The built environments adapters are trained on; with `skip_without_signal`, not those calibration
        rejected with no group of mixed rewards (a constant group's advantages are 0: training there
        would spend rollouts on no gradient at all)."""
        return [e.capability for e in self.environments if e.status == "DONE" and not (
            skip_without_signal and e.calibration is not None and not e.calibration.accepted
            and e.calibration.without_signal)]


# ----------------------------------------------------------------------------- adapter runs (step 3)


class TrainRun(Contract):
    """adapters/<c>/train_config.json: what a training run was started with (a resumed run must match it)."""

    config: dict[str, Any] = Field(description="The resolved TrainConfig.")
    base: str = Field(description="The base model.")
    env: str = Field(description="The environment trained on (env directory or target name).")
    env_digest: str | None = Field(description="sha256 of the files that define a synthesized environment (env.json, "
                                   "target.json, its module): which environment an adapter was trained on, wherever "
                                   "it lies. None for a registered environment (`env` names it).")
    init_adapter: str | None = None
    rollouts: str = Field(description="'local' or the rollout server's URL.")
    world_size: int = 1
    dtype: str | None = Field(None, description="The precision the base was trained in (float32, bfloat16, "
                              "float16); None in files written before it was recorded.")


class MetricsRow(Record):
    """One line of metrics.jsonl: a GRPO step (step 0: the evaluation before training)."""

    step: int = Field(description="GRPO steps done (0: the held-out evaluation before training).")
    rollouts_used: int = Field(description="Rollouts consumed so far, resampled ones included.")
    reward_mean: float | None = Field(None, description="Mean reward of the step's rollouts.")
    reward_std: float | None = Field(None, description="Their standard deviation.")
    success_rate: float | None = Field(None, description="Share of the step's rollouts that passed.")
    groups_sampled: int | None = Field(None, description="GRPO groups sampled this step.")
    informative_groups: int | None = Field(None, description="Groups with unequal rewards (the others carry no signal).")
    sampling_rounds: int | None = Field(None, description="Sampling rounds (resampling while groups were uninformative).")
    loss: float | None = Field(None, description="The GRPO loss; None when no group was informative.")
    clip_ratio: float | None = Field(None, description="Share of loss tokens whose ratio was clipped.")
    approx_kl: float | None = Field(None, description="Mean approximate KL, sampler vs trained policy, per loss token.")
    kl: float | None = Field(None, description="Mean KL to the reference (base) policy per loss token.")
    entropy: float | None = Field(None, description="Mean token entropy over loss tokens.")
    grad_norm: float | None = Field(None, description="Gradient norm before clipping.")
    trained_sequences: int | None = Field(None, description="Sequences in the update.")
    loss_tokens: int | None = Field(None, description="Tokens the loss was taken over.")
    rollout_seconds: float | None = Field(None, description="Wall time of sampling.")
    update_seconds: float | None = Field(None, description="Wall time of the update.")
    eval_success: float | None = Field(None, description="Held-out greedy success, on evaluation steps only.")
    eval_episodes: int | None = Field(None, description="The held-out episodes eval_success is over.")
    seconds: float | None = Field(None, description="Wall time of the whole step.")


def read_metrics(path: str | Path) -> list[MetricsRow]:
    """The rows of a metrics.jsonl ([] when there is none yet)."""
    return read_jsonl(path, MetricsRow) if Path(path).exists() else []


def metrics_text(rows: list[dict[str, Any]]) -> str:
    """metrics.jsonl's text of rows as the trainer logs them (each checked against MetricsRow)."""
    return "".join(MetricsRow.model_validate(r).model_dump_json(exclude_unset=True) + "\n" for r in rows)


# ----------------------------------------------------------------------------- composition (step 4)


class GateKept(Record):
    trajectories: int = Field(description="Rollouts whose tokens take the gates' LM loss (every one's opening takes the label loss).")
    of: int = Field(description="Rollouts played.")
    source: str = Field(description="'successful', the best reward kept when none succeeded, or 'openings'.")
    openings: int = Field(0, description="Openings read from the environment's reset, no episode played: all "
                                         "the router and gates routed at the opening learn from.")


class GateData(Contract):
    """gate_data/summary.json: what the router and gates learn from — the adapters' rollouts on their
    own environments, or (when no composition needs whole episodes) those environments' openings."""

    rollouts: int = Field(description="Rollouts played for gate training (they count in TRACE's budget).")
    kept: dict[str, GateKept]


COMPOSITION_FORMAT = "tracerl.composition/2"


@dataclass(frozen=True)
class CompositionMode:
    """One way of composing the adapters: its folder in a run's workspace and the variant it is evaluated as."""

    name: str
    folder: str
    variant: str
    summary: str


# Every composition mode, in order: the first one a run composes is "TRACE" in the report's headline.
COMPOSITION_MODES: dict[str, CompositionMode] = {m.name: m for m in (
    CompositionMode("moe", "composed", "trace_moe", "a gate per decoder layer routes each token to one adapter "
                    "(or, routed at the opening, each episode by the gates' majority over its opening)"),
    CompositionMode("router", "composed_router", "trace_router", "the task router sends each episode to one adapter"),
    CompositionMode("merge", "composed_merge", "trace_merge", "the task router's top-p adapters, merged by its "
                    "weights, serve each episode"),
)}
MOE_ROUTINGS = ("token", "opening")  # moe: each token routes itself, or each episode at its opening


def composition_mode_of_variant(variant: str) -> CompositionMode | None:
    """The composition mode evaluated as `variant` (trace_moe → moe), None for any other variant."""
    return next((m for m in COMPOSITION_MODES.values() if m.variant == variant), None)


class AdapterRef(Record):
    name: str
    path: str = Field(description="Relative to the composed directory when local, else a hub id.")


class RouterSettings(Record):
    labels: list[str]
    base_description: str
    top_p: float = 0.9
    kind: Literal["zero-shot", "label-head"] = Field("zero-shot", description="label-head: router_head.safetensors was fitted.")
    fit: dict[str, Any] | None = None


class RoutingAccuracy(Record):
    overall: float | None = Field(description="Share of held-out prompts routed to their capability's slot.")
    per_capability: dict[str, float]
    num_prompts: int
    method: str


class CompositionSpec(Contract):
    """composition.json (written last: a composed directory without it is incomplete)."""

    format: str = COMPOSITION_FORMAT
    model_name: str
    mode: Literal["moe", "router", "merge"]
    base: str = Field(description="Relative to the composed directory when local, else a hub id.")
    adapters: list[AdapterRef]
    capabilities: list[Capability] = Field(description="In slot order: capability i has slot i + 1 (slot 0: base).")
    slots: list[str]
    gate_parameters: int = 0
    moe_routing: Literal["token", "opening"] | None = Field(
        None, description="moe: each token routes itself (token), or the gates' per-token majority over the "
                          "episode's opening routes every token of it (opening); None for router/merge.")
    router: RouterSettings | None = None
    gate_training: dict[str, Any] | None = None
    routing_accuracy: RoutingAccuracy | None = None
    template_kwargs: dict[str, Any] = Field(default_factory=dict)
    dtype: str | None = Field(None, description="The precision the base was composed in (its gates fitted in): what "
                              "`load_composed` loads it in unless told otherwise; None in files written before it "
                              "was recorded (the checkpoint's own).")

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v != COMPOSITION_FORMAT:
            raise ValueError(f"unknown format {v!r} (expected {COMPOSITION_FORMAT!r}: compose again)")
        return v


# ----------------------------------------------------------------------------- evaluation


class Grading(Record):
    """Who graded a live target's episodes (a `tau2:<domain>` target): shown with the results."""

    grader: str = Field(description="e.g. 'τ²-bench 1.0.1'")
    reward_basis: list[str] = Field(description="The reward components the episodes were graded on (union over tasks).")
    user_simulator: dict[str, Any] | None = Field(description="The user simulator's endpoint (model, base_url, temperature).")
    judge: dict[str, Any] | None = Field(description="The NL-assertion judge's endpoint; None when the basis needs none.")


class EvalResult(Contract):
    """eval/<variant>.json: one variant on the target's held-out tasks."""

    variant: str
    pass1: Interval = Field(description="pass^1 with a 95% bootstrap interval over tasks.")
    pass_k: dict[str, float] = Field(description="τ²-bench's pass^k for k ≤ trials.")
    diff_vs_base: Interval | None = Field(description="Paired difference to the base over tasks; None for the base.")
    rollouts_used: int = Field(description="Rollouts the variant consumed in training.")
    n_tasks: int
    trials: int
    mean_reward: float
    failures_by_capability: dict[str, int] = Field(description="Failed trajectories the rules labeller finds LACKING it.")
    per_task: dict[str, float] = Field(description="Task id → pass rate over its trials.")
    grading: Grading | None = Field(None, description="A live target's grader; None for a built-in domain.")
    dtype: str | None = Field(None, description="The precision the variant's model ran in (in-process, or the "
                              "served-policy check's local model); None in files written before it was recorded.")

    @field_validator("pass1")
    @classmethod
    def _rate_in_unit_interval(cls, value: Interval) -> Interval:
        if not all(0.0 <= x <= 1.0 for x in (value.mean, value.low, value.high)):
            raise ValueError("pass rates must lie in [0, 1]")
        return value


class CurvePoint(Record):
    """TRACE's composed model at one budget, on the validation episodes."""

    step: int = Field(ge=0, description="GRPO steps every adapter had taken: their snapshots at this step were composed.")
    rollouts: int = Field(ge=0, description="Rollouts consumed there: every adapter's rollouts_used at this step "
                          "plus the gate-data rollouts (counted as in TRACE's final budget).")
    passed: int = Field(ge=0, description="Held-out episodes that passed.")
    episodes: int = Field(ge=1, description="Held-out episodes played (train.eval_episodes), greedy.")

    @property
    def success(self) -> float:
        return self.passed / self.episodes

    @model_validator(mode="after")
    def _passed_within_played(self) -> CurvePoint:
        if self.passed > self.episodes:
            raise ValueError(f"{self.passed} passed of {self.episodes} episodes")
        return self


class TraceCurve(Contract):
    """curve/curve.json: TRACE's success at each budget its adapters were evaluated at, on the validation
    episodes GRPO-on-target's eval_success is measured on (held-out tasks of the target's train split,
    as many, greedy)."""

    variant: str = Field(description="The TRACE variant whose composition was reused (trace_moe, else trace_router, "
                         "else trace_merge: the report's TRACE).")
    composed: str = Field(description="Its composed directory, relative to this file's folder: its gates or router, "
                          "fitted to the final adapters, route every point's snapshots.")
    eval_seed_start: int = Field(description="Validation seeds eval_seed_start + i, i below each point's episodes "
                                 "(tasks of the target's train split).")
    points: list[CurvePoint] = Field(description="By step, the final adapters' included.")
    note: str | None = Field(None, description="Why there are no points (e.g. no snapshots, evaluation off).")


class PromptCandidate(Record):
    """One system prompt GEPA kept, scored on its validation tasks."""

    prompt: str
    parents: list[int] = Field(description="Indices of the candidates it was proposed from (none for the seed).")
    val_score: float = Field(description="Mean reward on GEPA's validation tasks (train split).")
    discovered_at: int = Field(ge=0, description="Rollouts GEPA had consumed when it found this candidate.")
    curve_passed: int | None = Field(None, ge=0, description="Validation episodes of the sample-efficiency curve it "
                                     "passed (running-best candidates only).")
    curve_episodes: int | None = Field(None, ge=1, description="Those episodes it played, greedy.")


class PromptOptimization(Contract):
    """baselines/gepa/result.json: GEPA's optimisation of the agent's system prompt at a rollout budget."""

    optimizer: str = Field(description="e.g. 'gepa 0.1.4'")
    reflection: dict[str, Any] = Field(description="The reflection model's endpoint (base_url, model).")
    budget: int = Field(ge=1, description="Rollouts allowed (TRACE's unless gepa.max_rollouts is set).")
    rollouts_used: int = Field(ge=0, description="Episodes GEPA played (never above the budget).")
    train_seeds: list[int] = Field(description="Train-split task seeds its reflection minibatches came from.")
    val_seeds: list[int] = Field(description="Train-split task seeds candidates were scored on.")
    reflection_minibatch_size: int
    reflection_calls: int = Field(ge=0, description="Requests to the reflection model.")
    seed_prompt: str = Field(description="The target's own system prompt, candidate 0.")
    candidates: list[PromptCandidate]
    best: int = Field(ge=0, description="Index of the candidate with the highest validation score: the `gepa` variant.")
    curve_seeds: list[int] = Field(description="Train-split seeds the running-best candidates were played on: the "
                                   "validation episodes of GRPO-on-target's checkpoints and TRACE's curve, which "
                                   "GEPA neither trains nor selects on.")
    log: str = Field("", description="GEPA's own log lines.")

    @property
    def best_prompt(self) -> str:
        return self.candidates[self.best].prompt


def eval_file_stem(variant: str) -> str:
    """eval/<stem>.json of a variant: ':' becomes '-' (`adapter:x` → `adapter-x`)."""
    return variant.replace(":", "-")




# ----------------------------------------------------------------------------- calibration (step 2)


class CalibrationBands(Record):
    """TRACE's acceptance bands (every one configurable)."""

    mean_reward: tuple[float, float] = (0.2, 0.6)
    success_rate: tuple[float, float] = (0.2, 0.6)
    min_reward_std: float = 0.05
    max_all_success: float = 0.2
    max_all_zero: float = 0.2
    max_constant: float = 0.5
    min_informative: float = 0.5


class CalibrationStats(Record):
    groups: int
    group_size: int
    mean_reward: float
    success_rate: float
    reward_std: float  # population std over all rollouts
    mean_group_std: float  # mean over groups of the within-group population std
    all_success: float  # share of groups where every sample succeeded
    all_zero: float  # share of groups where every reward is 0
    constant: float  # share of groups whose rewards are all equal (includes the two above)
    informative: float  # 1 − constant: groups that carry a GRPO signal
    pass_at_k: dict[str, float] = Field(default_factory=dict)  # "1", "4", …: k ≤ group size only

    @property
    def without_signal(self) -> bool:
        """Every group's rewards were equal: GRPO would learn nothing here."""
        return self.informative == 0


class CalibrationRound(Record):
    difficulty: int
    stats: CalibrationStats
    accepted: bool
    reasons: list[str]


class CalibrationResult(Contract):
    """envs/<c>/calibration.json: the base policy's figures on the environment, round by round
    (computed by `synthesis.calibration.calibrate`)."""

    accepted: bool
    difficulty: int  # the accepted difficulty, or the last one tried
    stats: CalibrationStats  # of that difficulty
    rounds: list[CalibrationRound]
    stop_reason: str
    bands: CalibrationBands
    policy: str
    seeds: list[int]
    group_size: int
    settings: dict[str, Any] = Field(default_factory=dict)  # e.g. temperature


# ----------------------------------------------------------------------------- report


class RolloutCount(Record):
    trajectories: int
    passed: int


class TrainingFinal(Record):
    steps: int
    rollouts_used: int
    reward_mean: float | None
    success_rate: float | None
    eval_success: float | None = Field(description="The last held-out success logged.")
    eval_success_start: float | None = Field(description="The first held-out success logged (step 0: before training).")


class TrainingSummary(Record):
    source: str = Field(description="The metrics.jsonl, relative to the workspace.")
    final: TrainingFinal
    rows: list[MetricsRow]


class HeadlineEntry(Record):
    variant: str
    pass1: Interval
    diff_vs_base: Interval | None
    rollouts_used: int


class Headline(Record):
    trace: HeadlineEntry | None = Field(description="trace_moe, else trace_router.")
    base: HeadlineEntry | None
    grpo_target: HeadlineEntry | None
    prompt_capabilities: HeadlineEntry | None
    gepa: HeadlineEntry | None = Field(None, description="GEPA's optimised system prompt, at TRACE's budget.")
    trace_vs_grpo_target: Interval | None = Field(description="Paired difference over tasks, TRACE − GRPO-on-target.")
    swe_rl: HeadlineEntry | None = Field(None, description="SWE-RL's baseline (`baselines.swe_rl`), where it ran.")
    trace_vs_swe_rl: Interval | None = Field(None, description="Paired difference over tasks, TRACE − SWE-RL.")
    routing_accuracy: float | None
    answer: str | None = Field(None, description="Does TRACE help here, by how much, at what budget: one sentence "
                               "(`tracerl.evaluation.report_data.answer`); None before TRACE and base are evaluated.")
    notes: list[str] = Field(default_factory=list, description="What qualifies the answer: environments calibration "
                             "rejected and trained anyway, adapters that learnt nothing, capabilities that passed "
                             "selection but were left out, a best validation checkpoint that beats the last.")


class EfficiencyPoint(Record):
    """A method's composed model or adapter at one budget, greedy on the validation episodes."""

    step: int = Field(description="GRPO steps done (0: untrained, i.e. the base).")
    rollouts: int = Field(description="Training rollouts consumed there.")
    passed: int
    episodes: int
    interval: Interval = Field(description="passed / episodes with its 95% Wilson interval.")


class BestCheckpoint(Record):
    """The checkpoint a method's validation curve would choose, against its last (what the test tasks measure)."""

    step: int
    success: float
    last_step: int
    last_success: float

    @property
    def beats_last(self) -> bool:
        return self.success > self.last_success


class SampleEfficiency(Record):
    """TRACE and GRPO on the target at every budget they were measured at, on the same validation
    episodes (held-out tasks of the target's train split, played greedily), beside their pass^1 on
    the test tasks at their final budget."""

    episodes: str = Field(description="Which validation episodes every point was played on, in words.")
    base: EfficiencyPoint | None = Field(description="Step 0 (no training: the base) on the same episodes.")
    trace: list[EfficiencyPoint] = Field(description="TRACE's composition of the adapters' snapshots, by step "
                                         "(rollouts: every adapter's at that step plus the gate data's).")
    grpo_target: list[EfficiencyPoint] = Field(description="GRPO on the target's checkpoints, by step.")
    swe_rl: list[EfficiencyPoint] = Field(default_factory=list, description="SWE-RL's checkpoints (GRPO with "
                                          "SWE-RL's reward), by step, where it ran.")
    best: dict[str, BestCheckpoint] = Field(description="Method → the checkpoint its validation curve chooses.")
    test: dict[str, Interval] = Field(description="Variant → pass^1 on the test tasks at its final budget "
                                      "(eval/<variant>.json): base, TRACE, GRPO on the target, SWE-RL, GEPA.")
    test_tasks: int = Field(description="Test tasks those were measured on.")
    note: str | None = Field(None, description="Why a curve is missing, when one is.")


class Outcome(Record):
    passed: bool
    reward: float
    termination: str


class Example(Record):
    task_id: str
    base: Outcome
    trace: Outcome


class ReportSummary(Contract):
    """report/report.json: every figure the report page shows."""

    workspace: str
    headline: Headline
    base_rollouts: RolloutCount | None
    capabilities: CapabilitiesFile | None
    calibration: dict[str, CalibrationResult]
    trained_rejected: list[str] = Field(description="Adapters trained on an environment calibration rejected.")
    training: dict[str, TrainingSummary]
    evaluation: dict[str, EvalResult] = Field(description="Variant → result, in display order.")
    routing_accuracy: float | None
    routing_accuracy_by_capability: dict[str, float]
    composition: CompositionSpec | None
    sample_efficiency: SampleEfficiency | None
    examples: list[Example]
    missing: dict[str, str] = Field(description="Section → why it is empty.")
    figures: dict[str, str] = Field(default_factory=dict, description="Figure → its PNG in report/.")


# ----------------------------------------------------------------------------- the run folder


ADAPTER_WEIGHTS = "adapter_model.safetensors"  # a PEFT adapter folder's weights (written last: the folder is whole)
ADAPTER_CONFIG = "adapter_config.json"  # a PEFT adapter folder's LoRA settings
METRICS_FILE = "metrics.jsonl"  # a training folder's metrics, one `MetricsRow` per line
SNAPSHOTS = "snapshots"  # a training folder's snapshots/step_<n>/: the adapter each held-out evaluation measured
_SNAPSHOT = re.compile(r"^step_(\d+)$")


def adapter_snapshots(adapter_dir: str | Path) -> dict[int, Path]:
    """Step → its adapter snapshot in `adapter_dir/snapshots/` (whole ones only), by step."""
    found = {}
    for path in (Path(adapter_dir) / SNAPSHOTS).glob("step_*"):
        match = _SNAPSHOT.match(path.name)
        if match and (path / ADAPTER_WEIGHTS).is_file():
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


class Workspace:
    """A run's folder and every path in it (`tracerl run -w DIR`):

        config.yaml                      the resolved run config
        rollouts/base.jsonl              base-agent rollouts on the target's train split
        capabilities.json, labels/       step 1 (labels/run_XX.json: one labelling run each)
        envs/index.json, envs/<c>/       step 2 (env.json, target.json, checks.json, calibration.json)
        adapters/<c>/                    step 3 (PEFT adapter, metrics.jsonl, checkpoints, snapshots/step_<n>/)
        gate_data/                       the adapters' rollouts or openings the compositions learn from
        composed*/                       step 4, one folder per composition mode (`COMPOSITION_MODES`)
        baselines/<name>/                a baseline trained at TRACE's rollout budget (grpo_target, swe_rl; gepa/result.json)
        curve/                           the sample-efficiency points (curve.json, step_<n>/, step_<n>.jsonl)
        eval/<variant>.json|.jsonl       held-out evaluation (eval/tau2/<variant>.json: τ²-bench's results file;
                                         eval/toolsandbox/<variant>/: a ToolSandBox run folder)
        report/index.html, report.json   the report
        .stages/<stage>.json             what each finished stage ran with (`tracerl.stages`)

    Every method returns an absolute path under `root`; `rel` gives it relative to the root (how a stage
    names its inputs and outputs).
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    # step 0-1
    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def base_rollouts(self) -> Path:
        return self.root / "rollouts" / "base.jsonl"

    @property
    def capabilities(self) -> Path:
        return self.root / "capabilities.json"

    @property
    def labels(self) -> Path:
        return self.root / "labels"

    def label_run(self, run: int) -> Path:
        return self.labels / f"run_{run:02d}.json"

    # step 2
    @property
    def envs(self) -> Path:
        return self.root / "envs"

    @property
    def env_index(self) -> Path:
        return self.envs / "index.json"

    def env(self, capability: str) -> Path:
        return self.envs / capability

    # step 3
    def adapter(self, capability: str) -> Path:
        return self.root / "adapters" / capability

    # step 4
    @property
    def gate_data(self) -> Path:
        return self.root / "gate_data"

    @property
    def gate_summary(self) -> Path:
        return self.gate_data / "summary.json"

    def composed(self, mode: str) -> Path:
        return self.root / COMPOSITION_MODES[mode].folder

    # baselines, curve, evaluation, report
    def baseline(self, name: str) -> Path:
        return self.root / "baselines" / name

    @property
    def gepa_result(self) -> Path:
        return self.baseline("gepa") / "result.json"

    @property
    def curve(self) -> Path:
        return self.root / "curve"

    @property
    def curve_file(self) -> Path:
        return self.curve / "curve.json"

    @property
    def eval(self) -> Path:
        return self.root / "eval"

    def eval_result(self, variant: str) -> Path:
        return self.eval / f"{eval_file_stem(variant)}.json"

    def eval_episodes(self, variant: str) -> Path:
        return self.eval / f"{eval_file_stem(variant)}.jsonl"

    def tau2_results(self, variant: str) -> Path:
        return self.eval / "tau2" / f"{eval_file_stem(variant)}.json"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def report_html(self) -> Path:
        return self.report / "index.html"

    @property
    def report_json(self) -> Path:
        return self.report / "report.json"

    # bookkeeping
    def stage_record(self, stage: str) -> Path:
        return self.root / ".stages" / f"{stage}.json"

    def stage_launch(self, stage: str) -> Path:
        """The run-config sections a training stage launched under torchrun runs with (`tracerl.pipeline_ranks`)."""
        return self.root / ".stages" / f"{stage.replace(':', '_')}.launch.json"

    @property
    def served_adapters(self) -> Path:
        return self.root / ".served_adapters"
