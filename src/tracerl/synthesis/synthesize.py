"""Step 2 end to end: selected capabilities → validated env directories → calibrated difficulty.

`synthesize_capability` builds one env directory (template when one fits and the generator is
"template", else an LLM-written module checked in the sandbox); `calibrate_env_dir` measures the
base policy on it, moves its difficulty into TRACE's bands when it can, and writes
calibration.json (and the chosen difficulty into env.json). `write_env_index` records what was
built in `<envs>/index.json`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tracerl.contracts import (
    CalibrationBands,
    CalibrationResult,
    Capability,
    CapabilityResult,
    CheckReport,
    EnvCalibration,
    EnvIndex,
    EnvRecord,
    EnvSpec,
)
from tracerl.core.policy import Policy
from tracerl.envs.synthetic.checks import DEFAULT_SEEDS, validate_env
from tracerl.envs.synthetic.envdir import (
    CALIBRATION_JSON,
    ENV_JSON,
    MODULE_PY,
    load_env_dir,
    load_env_spec,
    write_env_dir,
)
from tracerl.envs.synthetic.target import Target
from tracerl.envs.synthetic.templates import MAX_DIFFICULTY, template_for
from tracerl.synthesis.calibration import calibrate
from tracerl.models.analysis import AnalysisClient
from tracerl.synthesis.llm import generate_env_module
from tracerl.synthesis.sandbox import SandboxLimits

Generator = Literal["template", "llm"]
INDEX_JSON = "index.json"  # envs/index.json: `tracerl.contracts.EnvIndex`


@dataclass
class SynthesisOutcome:
    capability: str
    source: str  # "template", "llm" or "-" (nothing built)
    env_dir: Path | None
    checks: CheckReport | None
    error: str | None = None
    rounds: int = 0  # LLM generation rounds used

    @property
    def ok(self) -> bool:
        return self.env_dir is not None and self.error is None


def capability_examples(cap: Capability, limit: int = 1500) -> list[str]:
    """Selection's example failed trajectories of a capability, as short texts for a prompt."""
    examples = cap.example_failed if isinstance(cap, CapabilityResult) else []
    return [json.dumps(e.model_dump(), ensure_ascii=False)[:limit] for e in examples[:3]]


def synthesize_capability(
    cap: Capability,
    target: Target,
    out_dir: Path,
    *,
    generator: Generator = "template",
    difficulty: int = 1,
    llm: AnalysisClient | None = None,  # the analysis model, for environments no template builds
    max_rounds: int = 5,
    limits: SandboxLimits | None = None,
    seeds: int = len(DEFAULT_SEEDS),
    hint_fraction: float = 0.25,
) -> SynthesisOutcome:
    """Build, check and write `out_dir/<capability>/` for one capability."""
    name, description = cap.name, cap.description
    env_dir = out_dir / name
    template = template_for(name, target) if generator == "template" else None
    if template is not None:
        report = validate_env(lambda: template(target, difficulty=difficulty), target.tools, seeds=range(seeds))
        if not report.passed:
            return SynthesisOutcome(name, "template", None, report, error=report.failures())
        spec = EnvSpec(capability=name, description=description or template.description, source="template",
                       template=template.capability, target=target.name, difficulty=difficulty,
                       hint_fraction=hint_fraction)
        write_env_dir(env_dir, spec, target, checks=report)
        return SynthesisOutcome(name, "template", env_dir, report)
    if llm is None:
        why = "no built-in template for it" if generator == "template" else "generator 'llm' chosen"
        return SynthesisOutcome(name, "-", None, None,
                                error=f"{why} and no analysis model configured (analysis.model and analysis.base_url, "
                                      "or --analysis-model and --analysis-base-url)")

    limits = limits or SandboxLimits(seeds=seeds, difficulty=difficulty)
    result = generate_env_module({"name": name, "description": description}, target, llm,
                                 examples=capability_examples(cap), max_rounds=max_rounds, limits=limits)
    if not result.ok or result.source is None:
        return SynthesisOutcome(name, "llm", None, result.sandbox.report if result.sandbox else None,
                                error=f"no valid module after {len(result.rounds)} rounds: {result.last_problem}",
                                rounds=len(result.rounds))
    spec = EnvSpec(capability=name, description=description, source="llm", module=MODULE_PY, target=target.name,
                   difficulty=limits.difficulty, hint_fraction=hint_fraction)
    report = result.sandbox.report if result.sandbox else None
    write_env_dir(env_dir, spec, target, checks=report, module_source=result.source)
    return SynthesisOutcome(name, "llm", env_dir, report, rounds=len(result.rounds))


def calibrate_env_dir(
    env_dir: str | Path,
    policy: Policy,
    *,
    seeds: int = 100,
    group_size: int = 16,
    bands: CalibrationBands | None = None,
    max_rounds: int = 5,
    settings: dict[str, Any] | None = None,
    on_done: Callable[[Any], None] | None = None,
    seed_start: int = 0,
) -> CalibrationResult:
    """Calibrate the env of `env_dir` with `policy`; write calibration.json and the chosen difficulty."""
    env_dir = Path(env_dir)
    spec = load_env_spec(env_dir)
    result = calibrate(
        lambda level: load_env_dir(env_dir, difficulty=level),
        policy,
        difficulty=spec.difficulty,
        seeds=range(seed_start, seed_start + seeds),
        group_size=group_size,
        bands=bands,
        max_rounds=max_rounds,
        max_difficulty=MAX_DIFFICULTY,  # LLM-written modules take the same 0–4 knob (see llm.CONTRACT)
        settings=settings,
        on_done=on_done,
    )
    result.write(env_dir / CALIBRATION_JSON)
    if result.difficulty != spec.difficulty:
        spec.model_copy(update={"difficulty": result.difficulty}).write(env_dir / ENV_JSON)
    return result


def env_record(outcome: SynthesisOutcome, calibration: CalibrationResult | None, out_dir: Path) -> EnvRecord:
    """envs/index.json's entry for one capability (`tracerl synthesize` and the pipeline alike)."""
    return EnvRecord(
        capability=outcome.capability, status="DONE" if outcome.ok else "FAILED",
        environment=None if outcome.env_dir is None else Path(outcome.env_dir).relative_to(out_dir).as_posix(),
        source=outcome.source, error=outcome.error,
        calibration=None if calibration is None else EnvCalibration(
            accepted=calibration.accepted, difficulty=calibration.difficulty,
            success_rate=calibration.stats.success_rate, without_signal=calibration.stats.without_signal,
            stop_reason=calibration.stop_reason),
    )


def write_env_index(out_dir: Path, target: str, generator: Generator, records: list[EnvRecord]) -> EnvIndex:
    index = EnvIndex(target=target, generator=generator, environments=records)
    index.write(Path(out_dir) / INDEX_JSON)
    return index
