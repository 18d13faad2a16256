"""`run_select`: TRACE step 1 over a list of rollouts — what `tracerl select` and the pipeline's
select stage both call, with one `SelectConfig` (the run config's `select:` section).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tracerl.contracts import CapabilitiesFile
from tracerl.core.errors import InputError
from tracerl.core.trajectory import Trajectory
from tracerl.selection.aggregate import SelectionParams
from tracerl.selection.catalogue import (
    catalogue_for,
    load_capabilities,
    merge_capabilities,
)
from tracerl.selection.discovery import discover
from tracerl.models.analysis import AnalysisClient, AnalysisConfig
from tracerl.selection.llm import LLMLabeller
from tracerl.selection.rules import RulesLabeller
from tracerl.selection.select import select_capabilities


class SelectConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    labeler: Literal["rules", "llm"] = "rules"
    runs: int = Field(10, ge=1, description="N labelling runs")
    min_runs: int | None = Field(None, ge=1, description="K: runs a capability must pass; None = round(0.8·N)")
    rho: float = Field(0.10, ge=0, le=1, description="coverage threshold ρ")
    delta: float = Field(0.20, ge=-1, le=1, description="contrastive-gap threshold δ")
    bootstrap: int = Field(1000, ge=0, description="bootstrap resamples for the Cov and Δ intervals")
    capabilities: str | None = Field(None, description="a YAML/JSON file of extra capabilities (one with a built-in "
                                     "capability's name replaces it)")
    discover: bool = Field(False, description="ask the analysis model to propose capabilities")
    max_selected: int | None = Field(None, ge=1, description="keep at most this many (by mean Δ)")

    @field_validator("min_runs")
    @classmethod
    def _k_of_n(cls, k: int | None, info: ValidationInfo) -> int | None:
        if k is not None and "runs" in info.data and k > info.data["runs"]:
            raise ValueError(f"K = {k} runs to pass, more than the N = {info.data['runs']} runs")
        return k


class SelectionRun(BaseModel):
    """What `run_select` returns: the document (written as capabilities.json) and the failed labelling requests."""
    document: CapabilitiesFile
    problems: list[str] = Field(default_factory=list)
    analysis: str | None = None  # what the analysis model was asked and what came back (`AnalysisStats.summary`)


def progress_steps(config: SelectConfig, trajectories: int) -> int:
    """Steps `run_select` reports to `on_step`: one per run (rules), one per labelled rollout per run (LLM)."""
    return config.runs if config.labeler == "rules" else trajectories * config.runs


def run_select(trajectories: list[Trajectory], config: SelectConfig, *, seed: int, out_dir: Path,
               llm: AnalysisConfig | None = None, on_step: Callable[[], None] | None = None) -> SelectionRun:
    """Label, aggregate and select into `out_dir` (capabilities.json, labels/). `llm` is the analysis
    model, needed by the LLM labeller and discovery; when it gives nothing usable, an InputError stops
    the stage before anything is written."""
    catalogue = catalogue_for(trajectories)
    if config.capabilities is not None:
        by_name = {c.name: c for c in load_capabilities(config.capabilities)}
        catalogue = merge_capabilities([by_name.pop(c.name, c) for c in catalogue], list(by_name.values()))
    if (config.labeler == "llm" or config.discover) and llm is None:
        raise InputError("the LLM labeller and discovery need the analysis model's endpoint")
    if llm is not None and (config.labeler == "llm" or config.discover):
        llm = llm.resolved()
        if config.labeler == "llm" and llm.temperature <= 0:
            raise InputError("the LLM labeller's temperature must be > 0: the N runs must be independent samples")
    client = AnalysisClient(llm) if llm is not None and (config.labeler == "llm" or config.discover) else None
    if config.discover:
        catalogue = merge_capabilities(catalogue, discover(client, trajectories, seed=seed))
    labeller = LLMLabeller(llm, client) if config.labeler == "llm" else RulesLabeller()
    params = SelectionParams(rho=config.rho, delta=config.delta, runs=config.runs, min_runs=config.min_runs,
                             bootstrap=config.bootstrap, seed=seed)
    on_run = None
    if on_step is not None:
        if labeller.deterministic:
            on_run = lambda _run: on_step()  # noqa: E731
        else:
            labeller.on_progress = on_step
    document, label_sets = select_capabilities(trajectories, catalogue, labeller, params, out_dir=out_dir,
                                               on_run=on_run)
    if config.max_selected is not None:
        for x in document.selected()[config.max_selected:]:
            x.selected, x.status = False, None
            x.note = f"it ranks {x.rank} by mean Δ, and select.max_selected keeps {config.max_selected}"
        document.write(out_dir / "capabilities.json")
    return SelectionRun(document=document, problems=[p for run in label_sets for p in run.problems],
                        analysis=None if client is None else client.stats.summary())
