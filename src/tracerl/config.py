"""The run configuration: every setting of `tracerl run`, named, defaulted and documented in one place.

A config file is YAML with any subset of these sections; what is left out takes the default.
Defaults are the embedded default (built-in airline target, the shipped tiny agent, rules labeller,
template environments, local rollouts) except where a section says it follows the paper's
GPU-scale setting. The resolved config is saved as `config.yaml` in the workspace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tracerl.baselines.config import GepaConfig
from tracerl.composition.stage import ComposeConfig
from tracerl.core.config_file import load_config_file
from tracerl.core.errors import InputError
from tracerl.core.sampling import RolloutSettings
from tracerl.envs.collect import CollectConfig
from tracerl.evaluation.stage import EvalConfig
from tracerl.models.analysis import AnalysisConfig
from tracerl.models.importing import GGUF_BASE
from tracerl.models.placement import DType
from tracerl.selection.stage import SelectConfig
from tracerl.synthesis.stage import SynthesizeConfig
from tracerl.training.config import TrainConfig, run_training_options


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(Section):
    base: str = Field("tiny-agent", description="the base agent: 'tiny-agent' (the shipped embedded agent), a local "
                      "directory or a Hugging Face model id loadable by AutoModelForCausalLM.from_pretrained, whose "
                      "chat template renders tools (`tracerl import-model` writes one from a GGUF or with a template)")
    server_url: str | None = Field(None, description="an OpenAI-compatible server (vLLM, `tracerl serve`) for "
                                   "GRPO rollouts, with runtime LoRA loading; None = roll out in-process")
    dtype: DType = Field("auto", description="the precision every stage loads the model in (collect, calibration, "
                         "training, compose, curve, eval, the served-policy check): 'auto' = the checkpoint's own "
                         "(float32 for the tiny agent, bfloat16 for Qwen3), or bfloat16, float16, float32. A vLLM "
                         "server is started with the same --dtype; the served-policy check's tolerance is this "
                         "precision's (tracerl.models.served.TOLERANCES)")
    served_tolerance: float | None = Field(None, gt=0, description="nats by which a rollout server's next-token "
                                           "log-probs may differ from the trainer's after a hot-swap (None: the "
                                           "precision's, tracerl.models.served.TOLERANCES: float32 2e-3, "
                                           "bfloat16 0.25, float16 0.03)")
    device: str = Field("auto", description="where the in-process stages put the model (collect, calibration, "
                        "compose, curve, eval, and training in the `tracerl run` process): 'auto' = the first "
                        "visible GPU when CUDA is available, else the CPU; or cpu, cuda, cuda:N. Training under "
                        "torchrun (`distributed.nproc_per_node` > 1) puts rank r on the r-th of "
                        "`distributed.devices`; docs/gpu.md gives each recipe's placement")

    @field_validator("base")
    @classmethod
    def _not_gguf(cls, base: str) -> str:
        if base.endswith(".gguf"):
            raise ValueError(GGUF_BASE)
        return base

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        for old in ("max_new_tokens", "batch_size"):
            if isinstance(data, dict) and old in data:
                raise ValueError(f"'{old}' is now rollout.{old} (the top-level `rollout:` block, shared by every stage)")
        return data


class TargetSection(Section):
    env: str = Field("airline", description="the target environment: a built-in or installed name (`tracerl envs` "
                     "lists them: 'airline', 'toolsandbox' (ToolSandBox's offline scenarios, played live), an entry "
                     "point of the group `tracerl.envs`), 'package.module:factory' (a factory on the Python path that "
                     "returns a tracerl.envs.base.Env; called with split=…), or 'tau2:<domain>' (τ²-bench's own "
                     "domain, played live)")
    policy: str | None = Field(None, description="a file of the domain's policy text (markdown): its title, rules "
                               "('Label: …' lines) and other lines replace those the target states, in the synthesized "
                               "environments' prompts and in what the LLM environment writer is given")
    results: str | None = Field(None, description="select from these rollouts instead of collecting: a τ²-bench "
                                "results JSON or tracerl JSONL (the later stages then need `tools`)")
    tools: str | None = Field(None, description="a τ²-bench tools.json for a target that is not built in")
    tau2: str | None = Field(None, description="a 'tau2:<domain>' target's settings: a YAML file of its user simulator, "
                             "judge, reward basis, … (tracerl.envs.tau2_live.Tau2Settings)")
    toolsandbox: str | None = Field(None, description="a 'toolsandbox' target's settings: a YAML file of its user "
                                    "simulator, splits, … (tracerl.envs.toolsandbox.ToolSandboxSettings)")


class BaselinesSection(Section):
    grpo_target: bool = Field(True, description="GRPO on the target's train split with TRACE's rollout budget")
    swe_rl: bool = Field(False, description="SWE-RL: GRPO on the target's train split with SWE-RL's reward (the "
                         "submitted patch's similarity to the gold patch, tracerl.envs.code.swe_rl) at TRACE's "
                         "rollout budget; a target with a `reward` option (the code domain)")
    prompt_capabilities: bool = Field(True, description="the base model with the capability descriptions in its prompt")
    single_adapters: bool = Field(True, description="evaluate each capability adapter alone")
    gepa: bool = Field(True, description="GEPA (the `gepa` package) optimising the agent's system prompt with the "
                       "analysis model as its reflection model, at TRACE's rollout budget (`gepa:` settings); "
                       "skipped, with a note, when no analysis model is configured")


class DistributedSection(Section):
    """How `tracerl run` trains (its train:<capability>, grpo_target and swe_rl stages) over several GPUs."""

    nproc_per_node: int = Field(1, ge=1, description="training processes per training stage: 1 trains in the "
                                "`tracerl run` process on model.device; N > 1 starts `torchrun --standalone "
                                "--nproc_per_node=N -m tracerl.pipeline_ranks WORKSPACE STAGE` for the stage (each rank "
                                "on its GPU, the stage's adapter written into the workspace as in one process) and "
                                "waits for it, then the run goes on to compose, eval and report")
    devices: list[int] | None = Field(None, description="the GPUs the training ranks take (the launch's "
                                      "CUDA_VISIBLE_DEVICES), nproc_per_node of them; None = the visible ones. "
                                      "Leave out the GPUs of the vLLM servers and model.device (docs/gpu.md)")

    @model_validator(mode="after")
    def _enough_devices(self) -> DistributedSection:
        if self.devices is not None and len(self.devices) != self.nproc_per_node:
            raise ValueError(f"distributed.devices names {len(self.devices)} GPUs for nproc_per_node {self.nproc_per_node}")
        return self


class TrainSection(TrainConfig):
    """`train:` of a run config: GRPO + LoRA. Its rollout settings are the run's top-level `rollout:` block."""

    @field_validator("rollout", mode="before")
    @classmethod
    def _in_the_run_block(cls, value: Any) -> Any:
        raise ValueError("a run config sets rollout settings once, in the top-level `rollout:` block")


class RunConfig(Section):
    seed: int = Field(0, description="seed of every stage's random draws: collection, selection's bootstrap, "
                      "training (unless `train.seed` is set), gates, evaluation")
    model: ModelSection = Field(default_factory=ModelSection)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="tokens per turn, batch size and "
                                     "sampling temperature: one block for every stage that plays episodes")
    target: TargetSection = Field(default_factory=TargetSection)
    collect: CollectConfig = Field(default_factory=CollectConfig)
    analysis: AnalysisConfig = Field(default_factory=AnalysisConfig, description="the OpenAI-compatible analysis "
                                     "model of the LLM labeller, discovery and LLM-written environments")
    select: SelectConfig = Field(default_factory=SelectConfig)
    synthesize: SynthesizeConfig = Field(default_factory=SynthesizeConfig)
    train: TrainSection = Field(default_factory=TrainSection, description="GRPO + LoRA, TRL/PEFT names")
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    train_rejected: bool | Literal["informative"] = Field(
        False, description="train adapters on environments calibration rejected (marked in the report): true = "
        "every one; 'informative' = those with a group of mixed rewards, the others left untrained (no GRPO "
        "signal; marked too); false = `tracerl run` stops before training one, exit 2")
    compose: ComposeConfig = Field(default_factory=ComposeConfig)
    baselines: BaselinesSection = Field(default_factory=BaselinesSection)
    gepa: GepaConfig = Field(default_factory=GepaConfig, description="GEPA's settings (baselines.gepa)")
    eval: EvalConfig = Field(default_factory=EvalConfig)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude={"train": {"rollout"}}), sort_keys=False)


def train_config(train: TrainConfig, rollout: RolloutSettings, seed: int) -> TrainConfig:
    """The GRPO config a training stage runs: `train` with the run's `rollout` block and, unless `train` sets
    its own, the run's `seed` (fields set stay set)."""
    return TrainConfig.model_validate(run_training_options({
        "seed": seed, "train": train.model_dump(exclude_unset=True, exclude={"rollout"}), "rollout": rollout.model_dump()}))


DEMO_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"


def load_run_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a run config; relative file paths in it are relative to the config file's folder."""
    config = load_config_file(RunConfig, path, overrides)
    here = Path(path).resolve().parent

    def resolve(value: str | None) -> str | None:
        return value if value is None or Path(value).is_absolute() else str((here / value).resolve())

    config.target.results = resolve(config.target.results)
    config.target.tools = resolve(config.target.tools)
    config.target.tau2 = resolve(config.target.tau2)
    config.target.toolsandbox = resolve(config.target.toolsandbox)
    config.target.policy = resolve(config.target.policy)
    config.select.capabilities = resolve(config.select.capabilities)
    if config.target.tau2 is not None and not Path(config.target.tau2).exists():
        raise InputError(f"target.tau2: no such file {config.target.tau2}", path=str(path))
    if config.target.toolsandbox is not None and not Path(config.target.toolsandbox).exists():
        raise InputError(f"target.toolsandbox: no such file {config.target.toolsandbox}", path=str(path))
    if config.target.policy is not None and not Path(config.target.policy).is_file():
        raise InputError(f"target.policy: no such file {config.target.policy}", path=str(path))
    if config.target.results is not None and not Path(config.target.results).exists():
        raise InputError(f"target.results: no such file {config.target.results}", path=str(path))
    return config
