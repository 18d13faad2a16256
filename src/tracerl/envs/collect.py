"""`run_collect`: a policy played on the first tasks of a target's split, written as rollouts — what
`tracerl collect` and the pipeline's collect stage both call, with one `CollectConfig` (the run
config's `collect:` section).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tracerl.core.errors import InputError
from tracerl.core.io import write_jsonl
from tracerl.core.policy import Policy
from tracerl.core.sampling import RolloutSettings
from tracerl.core.trajectory import Trajectory
from tracerl.envs.registry import make_env
from tracerl.envs.runner import Episode, rollout
from tracerl.envs.tau2_live import write_tau2_results


class CollectConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: int = Field(200, ge=1, description="base-agent rollouts on the target's train split")
    temperature: float = Field(0.0, ge=0, description="0 = greedy; its own, not rollout.temperature: collect measures "
                               "the base agent's behaviour, GRPO samples to explore")


def target_factory(env: str, split: str, settings: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A factory of the target environment `env` on `split` (`settings`: the factory's other options, e.g. a
    tau2:<domain> target's, or {"settings": a YAML file} for ToolSandBox)."""
    return lambda: make_env(env, split=split, **(settings or {}))


def task_seeds(make_env: Callable[[], Any], split: str, n: int, offset: int = 0) -> list[int]:
    """The `n` tasks of the target's split after `offset`, as the target numbers them (`Env.task_seeds`)."""
    try:
        return make_env().task_seeds(n, offset)  # an unknown env or split is an InputError here
    except ValueError as e:
        raise InputError(f"target, split '{split}': {e}") from None


@dataclass
class Collected:
    trajectories: list[Trajectory]
    policy: str  # the policy's name


def run_collect(make_env: Callable[[], Any], make_policy: Callable[[], Policy], config: CollectConfig, out: Path, *,
                split: str, rollout_settings: RolloutSettings, offset: int = 0, tau2_results: Path | None = None,
                native_results: Path | None = None, on_done: Callable[[Trajectory], None] | None = None) -> Collected:
    """Play `make_policy()` (built at `config.temperature` by the caller, once the tasks are known to exist)
    on `config.tasks` tasks of `split` after `offset`, `rollout_settings.batch_size` episodes at once; write
    them to `out` (and, for a τ²-bench target, its own results file `tau2_results`; for a target with a
    results format of its own, `Env.write_results`, e.g. a ToolSandBox run folder, `native_results`)."""
    seeds = task_seeds(make_env, split, config.tasks, offset)
    policy = make_policy()
    trajectories = rollout(make_env, policy, [Episode(seed=s) for s in seeds], batch_size=rollout_settings.batch_size,
                           on_done=on_done)
    write_jsonl(out, trajectories)
    if tau2_results is not None:
        write_tau2_results(tau2_results, make_env(), trajectories, agent=policy.name)
    if native_results is not None:
        env = make_env()
        if not env.write_results(native_results, trajectories, agent=policy.name):
            raise InputError(f"target {env.name} has no results format of its own to write {native_results} in")
    return Collected(trajectories, policy.name)
