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

import re
from pathlib import Path
from typing import Any, Literal

from peft import LoraConfig
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracerl.core.config_file import load_yaml, validate_config
from tracerl.core.errors import InputError
from tracerl.core.sampling import RolloutSettings

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSettings(BaseModel):
    """The subset of PEFT's `LoraConfig` we expose (same names, same meaning; bias "none", task CAUSAL_LM)."""
    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1, description="Rank of the LoRA update B·A (default 16).")
    lora_alpha: float = Field(16, gt=0, description="LoRA scaling numerator: the update added to a weight is "
                              "(lora_alpha / r)·B·A (default 16).")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout probability on the LoRA branch's input while "
                                "training (default 0.0); its mask is seeded per step, so a resumed run repeats it.")
    target_modules: list[str] = Field(default_factory=lambda: list(ALL_PROJECTIONS), description="Names of the "
                                      "linear modules that get an adapter (default all seven projections: q_proj, "
                                      "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj); a name the base model "
                                      "lacks is an error, but gate_proj, up_proj and down_proj on a base whose "
                                      "experts are fused (see target_parameters).")
    target_parameters: list[str] | None = Field(None, description="PEFT's target_parameters: weights held as "
                                                "parameters, not linear modules, that get an adapter (one LoRA per "
                                                "expert) — the fused expert weights of a mixture-of-experts base "
                                                "(default None: on a base whose experts are fused parameters, as "
                                                "transformers 5's Qwen3-MoE, its expert weights, "
                                                "mlp.experts.gate_up_proj and mlp.experts.down_proj, standing for "
                                                "gate_proj, up_proj and down_proj; on any other base, none). [] "
                                                "leaves the experts without an adapter. They take no lora_dropout.")

    def peft_config_for(self, model: Any):
        """The `LoraConfig` for `model`: `target_modules` it has, and its fused expert weights (see
        `target_parameters`); a target it lacks is an `InputError`."""
        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        fused = fused_expert_parameters(model)
        excused = set(MLP_PROJECTIONS) if fused else set()
        missing = [m for m in self.target_modules if m not in names and m not in excused]
        if missing:
            raise InputError(f"lora.target_modules not in the base model: {', '.join(missing)}")
        params = fused if self.target_parameters is None else list(self.target_parameters)
        absent = [p for p in params if p not in fused_expert_parameters(model, all_3d=True)]
        if absent:
            raise InputError(f"lora.target_parameters not in the base model: {', '.join(absent)}")
        if params and self.lora_dropout:
            raise InputError("lora.lora_dropout must be 0 with expert weights as targets (lora.target_parameters)")
        modules = [m for m in self.target_modules if m in names]

        return LoraConfig(r=self.r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout, target_modules=modules,
                          bias="none", task_type="CAUSAL_LM", **({"target_parameters": params} if params else {}))


MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def fused_expert_parameters(model: Any, all_3d: bool = False) -> list[str]:
    """The fused expert weights of a mixture-of-experts base, named as PEFT's target_parameters name them
    (the module path after `layers.<i>.`, then the parameter: "mlp.experts.gate_up_proj"): the 3-D
    parameters of modules whose class name ends in "Experts" (with `all_3d`, of any module)."""
    found: list[str] = []
    for path, module in model.named_modules():
        if not all_3d and not type(module).__name__.endswith("Experts"):
            continue
        for name, p in module.named_parameters(recurse=False):
            if p.dim() != 3:
                continue
            key = re.sub(r"^.*?\blayers\.\d+\.", "", f"{path}.{name}")
            key = key.replace(".base_layer", "")
            if key not in found:
                found.append(key)
    return found


MOVED_TO_ROLLOUT = {"max_new_tokens": "max_new_tokens", "rollout_batch_size": "batch_size", "temperature": "temperature"}


class TrainConfig(BaseModel):
    """One GRPO run (one capability adapter). Names follow TRL's `GRPOConfig` where TRL has the knob.

    Each field's description states its default and what it does, as TRL documents `GRPOConfig`
    (`TrainConfig.model_fields[name].description`). Fields without a TRL counterpart say so.

    Where the objective differs from TRL's `GRPOTrainer` on the same batch and the same `loss_type`:

    - Constant groups are dropped. A group whose rollouts all got the same reward has advantage 0.
      TRL keeps its sequences in the batch: they add nothing to the surrogate but count in the
      normaliser (the sequence count B of "grpo" and "dr_grpo", the loss-token count of "dapo"). Here
      they are not trained on, so the normaliser counts the informative groups only: the loss and
      its gradient are TRL's times (all sequences / informative sequences) for "grpo" and "dr_grpo",
      times (all loss tokens / informative loss tokens) for "dapo". With beta > 0 the dropped groups
      carry no KL term either. A step may sample extra rounds (`max_resample_tries`), so its batch
      can hold more than `groups_per_step` groups; every informative one is trained on.
    - `loss_type` defaults to "grpo" (each sequence's token mean, averaged over sequences); TRL's
      default is "dapo". Every normaliser is the whole step's count (all micro-batches, all ranks);
      TRL's "grpo" averages within each micro-batch and then over the accumulation steps, which
      equals this only when every micro-batch holds as many sequences.
    - `max_completion_length` limits nothing here: it is only the constant L of "dr_grpo"'s
      Σ loss / (B·L). In TRL it is also the longest completion generated. Here generation stops per
      assistant turn at `rollout.max_new_tokens`, and a sequence's loss tokens are all the turns of
      its episode, so a sequence can hold more than `max_completion_length` loss tokens.
    - A sequence is a whole multi-turn episode: the model's turns take loss, the environment's
      (user and tool messages) are context only. The old log-probs are the sampler's, recorded as it
      generated (a hinted rollout's are recomputed on the hint-free prompt, see `hint_fraction`);
      TRL recomputes them with the training model when `num_iterations` > 1.
    """
    model_config = ConfigDict(extra="forbid")

    # --- sampling -----------------------------------------------------------------------------
    num_generations: int = Field(8, ge=2, description="Rollouts per group (default 8): episodes reset with the same "
                                 "task seed whose rewards are compared with each other (TRL's G). At least 2.")
    groups_per_step: int = Field(8, ge=1, description="Groups (task instances) sampled per step (default 8): a "
                                 "step's first round plays groups_per_step × num_generations episodes. Not in TRL "
                                 "(its generation_batch_size / num_generations).")
    hint_fraction: float = Field(0.0, ge=0, le=1, description="Share of each group's rollouts sampled with the "
                                 "environment's hint (default 0.0: none; when > 0 at least one per group). The hint "
                                 "is removed from the prompt the loss sees. Not in TRL.")
    max_resample_tries: int = Field(3, ge=1, description="Most sampling rounds per step (default 3): while fewer "
                                    "than min_informative_fraction × groups_per_step of the groups sampled so far are "
                                    "informative, another round of groups_per_step new groups is sampled. Every "
                                    "rollout counts toward max_rollouts. Not in TRL (DAPO's dynamic sampling).")
    min_informative_fraction: float = Field(0.5, ge=0, le=1, description="Informative groups (rewards not all "
                                            "equal) a step wants, as a share of groups_per_step (default 0.5); fewer "
                                            "start another sampling round (see max_resample_tries). Not in TRL.")
    # --- objective ----------------------------------------------------------------------------
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = Field("grpo", description="How token losses become the loss "
                                                          "(default \"grpo\"; TRL's default is \"dapo\"): \"grpo\" "
                                                          "averages each sequence's tokens, then the sequences; "
                                                          "\"dapo\" divides the sum by the batch's loss tokens; "
                                                          "\"dr_grpo\" divides it by sequences × "
                                                          "max_completion_length. Counts are the whole step's, after "
                                                          "constant groups are dropped (see the class docstring).")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="Advantage scaling, as TRL's "
                                                              "(default \"group\"): A = (r − group mean) / (std + "
                                                              "1e-4) with the group's std (\"group\") or the std of "
                                                              "every reward sampled for the step, constant groups "
                                                              "included (\"batch\"); \"none\" leaves r − group mean "
                                                              "(Dr. GRPO). std is Bessel-corrected.")
    epsilon: float = Field(0.2, ge=0, description="Lower clip of the importance ratio ρ = π/π_old: the surrogate "
                           "uses clip(ρ, 1 − epsilon, 1 + epsilon_high) (default 0.2).")
    epsilon_high: float | None = Field(0.28, ge=0, description="Upper clip of the importance ratio (default 0.28, "
                                       "DAPO's clip-higher; TRL's default None); None = epsilon.")
    beta: float = Field(0.0, ge=0, description="KL coefficient toward the base model, the adapter disabled "
                        "(default 0.0: no KL term and no reference forward). The per-token KL is TRL's k3 estimate, "
                        "exp(ref − logp) − (ref − logp) − 1.")
    max_completion_length: int = Field(256, ge=1, description="The constant L of loss_type \"dr_grpo\", whose "
                                       "loss is divided by sequences × L (default 256). Nothing else: unlike TRL's it "
                                       "does not limit generation (rollout.max_new_tokens does, per assistant turn).")
    num_iterations: int = Field(1, ge=1, description="Optimizer steps on each step's batch (default 1; TRL's μ): "
                                "each runs every micro-batch, then one AdamW step. From the second on the ratio to "
                                "the sampler's log-probs moves off 1 and clipping applies.")
    # --- optimiser ----------------------------------------------------------------------------
    learning_rate: float = Field(1e-5, gt=0, description="AdamW learning rate, constant: no warm-up, no decay "
                                 "(default 1e-5; TRL's default 1e-6).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay on the adapter (default 0.0).")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW's β1, the gradient average's decay (default 0.9).")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="AdamW's β2, the squared gradient average's decay "
                              "(default 0.999).")
    max_grad_norm: float = Field(1.0, gt=0, description="The adapter's gradient (summed over ranks) is clipped to "
                                 "this global L2 norm before each AdamW step (default 1.0).")
    per_device_train_batch_size: int = Field(16, ge=1, description="Sequences per forward/backward micro-batch on "
                                             "each rank (default 16). The whole step's batch is accumulated into "
                                             "every optimizer step, so it sets memory and speed, not the loss (up "
                                             "to float rounding). One group per micro-batch runs its shared prompt "
                                             "once.")
    per_device_train_batch_tokens: int | None = Field(None, ge=1, description="Padded tokens per micro-batch on "
                                                      "each rank (default None: per_device_train_batch_size alone "
                                                      "bounds it): a micro-batch takes sequences in order while their "
                                                      "count × the longest one's length fits; a longer sequence runs "
                                                      "alone. Like per_device_train_batch_size it sets memory, not "
                                                      "the loss. Not in TRL.")
    gradient_checkpointing: bool = Field(False, description="Recompute each decoder layer's activations in backward "
                                         "instead of keeping them (default False; transformers' non-reentrant "
                                         "gradient checkpointing, as TRL's gradient_checkpointing): a training "
                                         "forward keeps one hidden state per layer, at about one more forward of "
                                         "compute. The shared prompt is then not run apart in the loss's forward.")
    shard: Literal["none", "fsdp2"] = Field("none", description="How the model is laid out over the ranks of "
                                             "a torchrun launch (default \"none\": every rank holds the whole base "
                                             "and adapter, gradients all-reduced as DDP does). \"fsdp2\": PyTorch "
                                             "FSDP2 (fully_shard, one unit per decoder layer) shards the frozen base "
                                             "and the adapter, each rank keeping about 1/N of them, for a base that "
                                             "does not fit on one GPU. Its rollouts come from servers "
                                             "(model.server_url, --server): in-process sampling, which would gather "
                                             "the whole model on every GPU, is refused. The shared prompt is not run "
                                             "apart. One process: nothing is sharded. Not in TRL (there: "
                                             "accelerate's FSDP settings).")
    # --- schedule, evaluation, checkpoints -----------------------------------------------------
    max_steps: int = Field(20, ge=1, description="Steps to train (default 20); one step is one batch of groups "
                           "and num_iterations optimizer steps. May be raised when resuming.")
    max_rollouts: int | None = Field(None, ge=1, description="Rollout budget (default None: none): no step or "
                                     "resampling round starts that would take the count past it. Every sampled "
                                     "training episode counts, uninformative and resampled ones too; evaluation "
                                     "episodes do not. May change when resuming. Not in TRL.")
    eval_steps: int = Field(5, ge=1, description="Evaluate every this many steps (default 5), and also at step 0 "
                            "and after the last step.")
    eval_episodes: int = Field(64, ge=0, description="Held-out episodes per evaluation, played greedily (default "
                               "64); eval_success is the share that passed. 0 turns evaluation off.")
    train_seeds: int = Field(100_000, ge=1, description="Training task seeds are drawn uniformly from "
                             "[0, train_seeds) (default 100_000), one per group. Not in TRL.")
    eval_seed_start: int = Field(1_000_000, ge=0, description="Held-out task seeds are eval_seed_start + i for i "
                                 "below eval_episodes (default 1_000_000); a training draw that falls on one is "
                                 "drawn again, so none is ever trained on. Not in TRL.")
    save_steps: int = Field(1, ge=1, description="Checkpoint (adapter, optimizer, RNG states, counters, metrics "
                            "rows) every this many steps and after the last (default 1). A resumed run continues from the "
                            "latest checkpoint, redoing the steps after it exactly.")
    seed: int = Field(0, description="Seed of every random draw (default 0): the LoRA initialisation, and per "
                      "(seed, step, round, rank) the task seeds, sampling and dropout, so a run repeats exactly.")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="The LoRA adapter trained, in PEFT's "
                               "LoraConfig names (default r 16, alpha 16, no dropout, all seven projections).")
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
        if self.eval_episodes and self.eval_seed_start < self.train_seeds and self.eval_episodes >= self.train_seeds:
            raise ValueError("the held-out seeds cover every training seed: nothing is left to train on")
        return self

    def heldout_seeds(self) -> list[int]:
        """The held-out task seeds every evaluation of a run plays, greedily: eval_seed_start + i for i below
        eval_episodes (for GRPO on the target in a run: validation tasks of the target's train split, which
        TRACE's curve points play too)."""
        return [self.eval_seed_start + i for i in range(self.eval_episodes)]

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def hinted_per_group(self) -> int:
        """Rollouts per group sampled with the hint: round(hint_fraction × G), at least 1 if hints are on."""
        if self.hint_fraction == 0:
            return 0
        return min(self.num_generations, max(1, round(self.hint_fraction * self.num_generations)))


def run_training_options(run: dict[str, Any]) -> dict[str, Any]:
    """A run config's (mapping's) training options, as every training stage and `tracerl train --config`
    read them: the run's `seed` unless `train` sets its own, `train`'s options, the run's `rollout` block."""
    return {**({"seed": run["seed"]} if "seed" in run else {}), **(run.get("train") or {}),
            **({"rollout": run["rollout"]} if "rollout" in run else {})}


def load_config(path: str | Path | None, **overrides: Any) -> TrainConfig:
    """Read a YAML training config (all keys optional; a run config is read as its training stages read it,
    `run_training_options`), apply non-None `overrides`; one line naming file and line if it is bad."""
    data: dict[str, Any] = {}
    node = None
    if path is not None:
        data, node = load_yaml(path)
        if "train" in data:  # a run config: as its training stages read it
            data, node = run_training_options(data), None
    data.update({k: v for k, v in overrides.items() if v is not None})
    return validate_config(TrainConfig, data, path=path, node=node)
