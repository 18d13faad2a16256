"""`run_evaluate`: one variant played on the target's held-out tasks, written as `eval/<variant>.json`
(its `EvalResult`), `eval/<variant>.jsonl` (the episodes) and, for a τ²-bench target, τ²-bench's own
results file (for a target with a results format of its own, `Env.write_results`, e.g. ToolSandBox:
`eval/<env name>/<variant>/`) — what the pipeline's eval stage calls for `tracerl run` and
`tracerl eval` alike, with one `EvalConfig` (the run config's `eval:` section).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tracerl.contracts import EvalResult, eval_file_stem
from tracerl.core.io import write_jsonl
from tracerl.core.policy import Policy
from tracerl.core.sampling import RolloutSettings
from tracerl.core.trajectory import Trajectory
from tracerl.envs.collect import task_seeds
from tracerl.envs.prompted import SystemPromptEnv
from tracerl.envs.tau2_live import write_tau2_results
from tracerl.evaluation.evaluate import (
    FailureCounter,
    WithSystemNote,
    play,
    summarize_variant,
)
from tracerl.models.composed.artifact import load_composed
from tracerl.models.composed.policy import ComposedPolicy


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: int = Field(200, ge=1, description="held-out test tasks")
    trials: int = Field(1, ge=1, description="trials per task (pass^k for k ≤ trials); trials > 1 sample at temperature")
    temperature: float = Field(0.0, ge=0, description="0 = greedy; its own, not rollout.temperature: evaluation "
                               "measures the agent")
    bootstrap: int = Field(2000, ge=100, description="resamples for the 95% intervals")

    def sampling_temperature(self) -> float:
        """The temperature played at: k > 1 greedy trials would all agree, so they sample at 1.0."""
        return self.temperature if self.trials == 1 or self.temperature > 0 else 1.0


@dataclass
class EvalVariant:
    """One evaluated variant: which model plays, and the rollouts its training consumed."""

    name: str  # base, trace_<mode>, grpo_target, gepa, prompt_capabilities, adapter:<capability>
    composed: Path | None = None  # a composed-model directory (it plays instead of the base)
    adapters: dict[str, Path] = field(default_factory=dict)  # name → adapter folder (at most one: it plays)
    note: str | None = None  # a system note (the prompting baseline)
    system_prompt: str | None = None  # the system prompt it plays with in place of the target's (GEPA's)
    rollouts_used: int = 0


def run_evaluate(variant: EvalVariant, make_env: Callable[[], Any], config: EvalConfig, out_dir: Path, *,
                 seed: int, rollout: RolloutSettings,
                 make_policy: Callable[[float, dict[str, Path]], AbstractContextManager[Policy]],
                 count_failures: FailureCounter | None = None, base: EvalResult | None = None,
                 tau2_results: bool = False, on_done: Callable[[Trajectory], None] | None = None,
                 dtype: str | None = None, device: str | None = None) -> EvalResult:
    """Play `variant` on the first `config.tasks` tasks of `make_env`'s split, `config.trials` times
    each, and write its files into `out_dir`. `make_policy(temperature, adapters)` is a context holding
    the base policy with `adapters` loaded (local, or on servers); `count_failures` counts the failures
    per selected capability; `base` is the base variant's result, for the paired difference.
    A composed variant loads in `dtype` on `device` (`tracerl.models.placement` names); `dtype` is recorded in
    the result (`make_policy`'s model is to be loaded in it too)."""
    if len(variant.adapters) > 1 or (variant.composed is not None and (variant.adapters or variant.note)):
        raise ValueError(f"variant {variant.name}: a composed model, or the base with at most one adapter")
    if variant.system_prompt is not None:
        target, prompt = make_env, variant.system_prompt
        make_env = lambda: SystemPromptEnv(target(), prompt)  # noqa: E731
    temperature = config.sampling_temperature()
    adapter = next(iter(variant.adapters), None)
    with ExitStack() as stack:
        if variant.composed is not None:
            policy: Any = ComposedPolicy(load_composed(variant.composed, device=device, dtype=dtype), temperature=temperature,
                                         seed=seed, max_new_tokens=rollout.max_new_tokens, max_batch_size=rollout.batch_size,
                                         kv_cache_tokens=rollout.kv_cache_tokens)
        else:
            policy = stack.enter_context(make_policy(temperature, variant.adapters))
            if variant.note is not None:
                policy = WithSystemNote(policy, variant.note)
        seeds = task_seeds(make_env, "test", config.tasks)
        trajectories = play(make_env, policy, seeds, trials=config.trials, adapter=adapter,
                            batch_size=rollout.batch_size, on_done=on_done)
    result = summarize_variant(variant.name, trajectories, rollouts_used=variant.rollouts_used,
                               count_failures=count_failures, base=base, bootstrap=config.bootstrap, seed=seed)
    if dtype is not None:
        result = result.model_copy(update={"dtype": dtype})
    stem = eval_file_stem(variant.name)
    write_jsonl(out_dir / f"{stem}.jsonl", trajectories)
    if tau2_results:  # τ²-bench's own results file too, for its tools (`tau2 view`)
        write_tau2_results(out_dir / "tau2" / f"{stem}.json", make_env(), trajectories, agent=variant.name)
    env = make_env()
    env.write_results(out_dir / env.name / stem, trajectories, agent=variant.name)  # the benchmark's own, if any
    result.write(out_dir / f"{stem}.json")
    return result
