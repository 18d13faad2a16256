"""The baselines' settings in a run config (kept apart from their code, which imports `gepa`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class GepaConfig(BaseModel):
    """`gepa:` of a run config: GEPA's settings (its `gepa.optimize` names where they are its own)."""

    model_config = ConfigDict(extra="forbid")

    train_tasks: int = Field(32, ge=1, description="GEPA's trainset: the first N tasks of the target's train split "
                             "(its reflection minibatches are drawn from these)")
    val_tasks: int = Field(16, ge=1, description="GEPA's valset: the N tasks of the train split after train_tasks "
                           "(candidates kept are scored on all of them; the best one is the `gepa` variant)")
    reflection_minibatch_size: int = Field(3, ge=1, description="tasks per reflection minibatch (GEPA's default 3)")
    candidate_selection_strategy: Literal["pareto", "current_best"] = Field(
        "pareto", description="how GEPA picks the parent to mutate (GEPA's default: pareto)")
    max_rollouts: int | None = Field(None, ge=1, description="the rollout budget (default None: TRACE's, every "
                                     "adapter's GRPO rollouts plus the gate data's)")
    temperature: float = Field(0.0, ge=0, description="the agent's sampling temperature on GEPA's tasks (0 = greedy, "
                               "as evaluation plays)")
    reflection_temperature: float = Field(1.0, ge=0, description="the reflection model's sampling temperature")
    reflection_max_tokens: int = Field(2048, ge=1, description="cap on each reflection answer")
    transcript_chars: int = Field(2000, ge=200, description="each example's transcript is cut to this many characters "
                                  "in the reflection prompt")
    curve_points: bool = Field(True, description="play each new running-best prompt on the sample-efficiency curve's "
                               "validation episodes (train.eval_episodes tasks of the train split after collect's)")
