"""`run_synthesize`: TRACE step 2 — one validated, calibrated environment per selected capability,
and `envs/index.json` — what `tracerl synthesize` and the pipeline's synthesize stage both call, with
one `SynthesizeConfig` (the run config's `synthesize:` section).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tracerl.contracts import (
    CalibrationBands,
    CalibrationResult,
    EnvIndex,
    read_capability_list,
)
from tracerl.core.errors import InputError
from tracerl.core.policy import Policy
from tracerl.envs.synthetic.target import Target
from tracerl.envs.synthetic.templates import template_for
from tracerl.models.analysis import AnalysisClient, AnalysisConfig
from tracerl.synthesis.synthesize import (
    calibrate_env_dir,
    env_record,
    synthesize_capability,
    write_env_index,
)


class SynthesizeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generator: Literal["template", "llm"] = "template"
    difficulty: int = Field(1, ge=0, description="the starting difficulty of every environment")
    hint_fraction: float = Field(0.25, ge=0, le=1, description="share of each GRPO group sampled with the hint "
                                 "(written to env.json; training uses it unless its config sets one)")
    calibrate: bool = True
    calibration_seeds: int = Field(100, ge=1, description="task instances per calibration round")
    group_size: int = Field(16, ge=1, description="samples per instance")
    temperature: float = Field(0.7, gt=0, description="calibration's sampling temperature; its own, not "
                               "rollout.temperature: the reference calibrates at 0.7 and trains at 1.0")
    max_rounds: int = Field(5, ge=1, description="difficulty adjustments (and LLM generation rounds) before giving up")
    bands: CalibrationBands = Field(default_factory=CalibrationBands)


@dataclass
class SynthesisRun:
    """What `run_synthesize` returns: the index it wrote and, per capability, its outcome and calibration."""
    index: EnvIndex
    outcomes: list[tuple[Any, CalibrationResult | None]] = field(default_factory=list)  # (SynthesisOutcome, …)
    analysis: str | None = None  # what the analysis model was asked and what came back (`AnalysisStats.summary`)

    @property
    def ok(self) -> bool:
        return all(outcome.ok for outcome, _ in self.outcomes)


def run_synthesize(capabilities: Path, target: Target, out_dir: Path, config: SynthesizeConfig, *,
                   make_policy: Callable[[], Policy] | None = None, policy_info: dict[str, Any] | None = None,
                   llm: AnalysisConfig | None = None, on_episode: Callable[[str], None] | None = None,
                   on_outcome: Callable[[Any], None] | None = None) -> SynthesisRun:
    """Synthesize (and, with `config.calibrate`, calibrate with a fresh `make_policy()` each) an
    environment per capability selected in the file `capabilities` into `out_dir`, then write
    `out_dir/index.json`.

    `policy_info` is recorded in each calibration.json's settings beside the temperature; `llm` is the
    analysis model for LLM-written environments; `on_episode(capability)` follows each calibration
    episode, `on_outcome(outcome)` each capability's synthesis. `capabilities` is selection's
    capabilities.json or a hand-written list (`read_capability_list`). The capabilities the LLM writes
    come first, so that an analysis model that answers nothing stops the stage (an InputError) before
    any environment is written."""
    selected = read_capability_list(capabilities)
    if not selected:
        raise InputError("no capability is selected: nothing to synthesize (selection found none whose absence "
                         "explains the agent's failures; its table is `tracerl select`'s, its figures this file's; "
                         "to build environments for gaps you know, give `tracerl synthesize --capabilities` a list of "
                         "names and descriptions)", path=str(capabilities))
    if config.calibrate and make_policy is None:
        raise InputError("calibration needs the base policy")
    client = AnalysisClient(llm) if llm is not None else None
    run = SynthesisRun(index=EnvIndex(target=target.name, generator=config.generator, environments=[]))
    records = []
    by_llm = [cap for cap in selected if config.generator == "llm" or template_for(cap.name, target) is None]
    for cap in by_llm + [cap for cap in selected if cap not in by_llm]:
        outcome = synthesize_capability(cap, target, out_dir, generator=config.generator, difficulty=config.difficulty,
                                        llm=client, max_rounds=config.max_rounds, hint_fraction=config.hint_fraction)
        if on_outcome is not None:
            on_outcome(outcome)
        result = None
        if outcome.ok and config.calibrate:
            result = calibrate_env_dir(outcome.env_dir, make_policy(), seeds=config.calibration_seeds,
                                       group_size=config.group_size, bands=config.bands, max_rounds=config.max_rounds,
                                       settings={"temperature": config.temperature, **(policy_info or {})},
                                       on_done=None if on_episode is None else lambda _t, name=cap.name: on_episode(name))
        records.append(env_record(outcome, result, out_dir))
        run.outcomes.append((outcome, result))
    order = [cap.name for cap in selected]
    records.sort(key=lambda r: order.index(r.capability))
    run.outcomes.sort(key=lambda pair: order.index(pair[0].capability))
    if client is not None and by_llm:
        run.analysis = client.stats.summary()
    run.index = write_env_index(out_dir, target.name, config.generator, records)
    return run
