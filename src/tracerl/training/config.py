"""Training configuration: every GRPO knob named as in TRL's `GRPOConfig`, LoRA as in PEFT's `LoraConfig`.

Defaults follow the paper / reference (GPU scale): LoRA r 16, alpha 16 on all seven projections,
clip-higher ε 0.2 / 0.28, no KL (β 0), temperature 1.0. `configs/train-tiny.yaml` holds the values
measured to work for the embedded tiny agent on CPU (r 8, lr 2e-3, temperature 0.7, 24 steps of 8 groups × 8
rollouts).

How episodes are played (tokens per turn, batch, sampling temperature) is `RolloutSettings`: the
`rollout:` block of a training config, and in a run config the top-level `rollout:` block that every
stage shares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tracerl.core.errors import InputError
from tracerl.core.io import describe_validation_error

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSettings(BaseModel):
    """The subset of PEFT's `LoraConfig` we expose (same names)."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1)
    lora_alpha: float = Field(16, gt=0)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: list(ALL_PROJECTIONS))

    def peft_config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
            target_modules=list(self.target_modules), bias="none", task_type="CAUSAL_LM",
        )


class RolloutSettings(BaseModel):
    """How episodes are played. In a run config this is the top-level `rollout:` block, the one place these
    are set for collect, calibrate, train, compose's gate data and eval."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(256, ge=1, description="tokens per assistant turn, every stage (a longer turn is "
                                "cut here); TRL's max_completion_length counts a whole completion instead")
    batch_size: int = Field(64, ge=1, description="episodes played in lockstep (and generated in one batch), every stage")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of GRPO's rollouts, its old-policy "
                               "log-probs, and compose's gate-data rollouts. Only where sampling must differ is it "
                               "set per stage: collect.temperature and eval.temperature (greedy, 0, by default: they "
                               "measure the agent) and synthesize.temperature (calibration, the reference's 0.7)")


MOVED_TO_ROLLOUT = {"max_new_tokens": "max_new_tokens", "rollout_batch_size": "batch_size", "temperature": "temperature"}


class TrainConfig(BaseModel):
    """One GRPO run (one capability adapter). Names follow TRL's GRPOConfig where TRL has the knob."""

    model_config = ConfigDict(extra="forbid")

    # --- sampling -----------------------------------------------------------------------------
    num_generations: int = Field(8, ge=2, description="rollouts per group (all reset with the same seed)")
    groups_per_step: int = Field(8, ge=1, description="groups (task instances) per optimizer step")
    hint_fraction: float = Field(0.0, ge=0, le=1, description="share of each group sampled with the env's hint")
    max_resample_tries: int = Field(3, ge=1, description="sampling rounds per step while < half the groups are informative")
    min_informative_fraction: float = Field(0.5, ge=0, le=1)
    # --- objective ----------------------------------------------------------------------------
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = "grpo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    epsilon: float = Field(0.2, ge=0)
    epsilon_high: float | None = Field(0.28, ge=0, description="upper clip; None = epsilon")
    beta: float = Field(0.0, ge=0, description="KL coefficient toward the base model (adapter disabled)")
    max_completion_length: int = Field(256, ge=1, description="dr_grpo's constant normaliser (generated tokens)")
    num_iterations: int = Field(1, ge=1, description="optimisation passes over each batch")
    # --- optimiser ----------------------------------------------------------------------------
    learning_rate: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    max_grad_norm: float = Field(1.0, gt=0)
    per_device_train_batch_size: int = Field(16, ge=1, description="sequences per forward/backward micro-batch")
    # --- schedule, evaluation, checkpoints -----------------------------------------------------
    max_steps: int = Field(20, ge=1)
    max_rollouts: int | None = Field(None, ge=1, description="stop before a step would exceed this many rollouts")
    eval_steps: int = Field(5, ge=1, description="evaluate every this many steps (and at step 0)")
    eval_episodes: int = Field(64, ge=0, description="held-out seeds per evaluation (greedy)")
    train_seeds: int = Field(100_000, ge=1, description="training task seeds are drawn from [0, train_seeds)")
    eval_seed_start: int = Field(1_000_000, ge=0, description="held-out seeds are eval_seed_start + i")
    save_steps: int = Field(1, ge=1, description="checkpoint every this many steps")
    seed: int = 0
    lora: LoraSettings = Field(default_factory=LoraSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="tokens per turn, batch size and "
                                     "sampling temperature of GRPO's rollouts (in a run config: the top-level `rollout`)")

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in MOVED_TO_ROLLOUT.items():
                if old in data:
                    raise ValueError(f"'{old}' is now rollout.{new} (the `rollout:` block)")
        return data

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.eval_episodes and self.eval_seed_start < self.train_seeds:
            raise ValueError("eval_seed_start must be ≥ train_seeds: held-out seeds may not be training seeds")
        return self

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def hinted_per_group(self) -> int:
        """Rollouts per group sampled with the hint: round(hint_fraction × G), at least 1 if hints are on."""
        if self.hint_fraction == 0:
            return 0
        return min(self.num_generations, max(1, round(self.hint_fraction * self.num_generations)))


def load_config(path: str | Path | None, **overrides) -> TrainConfig:
    """Read a YAML/JSON config (all keys optional), apply non-None `overrides`; one-line error if bad."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise InputError("no such config file", path=str(path)) from None
        except yaml.YAMLError as e:
            line = getattr(getattr(e, "problem_mark", None), "line", None)
            raise InputError("not valid YAML", path=str(path), line=None if line is None else line + 1) from None
        if not isinstance(data, dict):
            raise InputError("a config must be a mapping of option: value", path=str(path))
        if "train" in data:  # a run config: its training section and its shared rollout block
            data = {**(data["train"] or {}), **({"rollout": data["rollout"]} if "rollout" in data else {})}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        raise InputError(describe_validation_error(e), path=None if path is None else str(path)) from None
