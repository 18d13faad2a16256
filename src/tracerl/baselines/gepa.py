"""GEPA as a baseline: the `gepa` package optimising the agent's system prompt, at TRACE's rollout budget.

GEPA (Agrawal et al., "GEPA: Reflective Prompt Evolution Can Outperform Reinforcement Learning",
github.com/gepa-ai/gepa) evolves a text component by reflection: it plays the current candidate on
a minibatch of training tasks, shows a reflection model the transcripts and their feedback, asks it
for a better text, keeps the new candidate when it scores higher on the same minibatch, and scores
kept candidates on a validation set, choosing parents from the Pareto front. Here the component is
the target's system prompt (`system_prompt`, seeded with the target's own), a candidate is played by
tracerl's rollout runner with the base model, greedily, on tasks of the target's train split
(`GepaConfig.train_tasks` for minibatches, the next `val_tasks` for validation, none of them a
validation episode of the sample-efficiency curve; the test split stays held out), and the
reflection model is any OpenAI-compatible endpoint (the run's analysis model).

Budget: every episode GEPA has played counts one rollout, as every other baseline counts them. A
GEPA iteration plays at most 2 × minibatch_size + val_tasks episodes (the parent and the child on
the minibatch, then the child on the validation set when it is kept), so GEPA is stopped before an
iteration that could take it past the budget: it never plays more than the budget, and may leave up
to one iteration's episodes unused. The seed prompt's validation score costs val_tasks rollouts
first. `baselines/gepa/result.json` (`PromptOptimization`) records every candidate with the
rollouts consumed when GEPA found it; the running best ones are also played on the validation
episodes GRPO-on-target's checkpoints and TRACE's curve are measured on (`curve_seeds`: evaluation,
not budget). The best candidate by validation score is the `gepa` variant
the eval stage plays on the test tasks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import gepa
from gepa.core.adapter import EvaluationBatch
from openai import OpenAI

from tracerl.baselines.config import GepaConfig
from tracerl.contracts import PromptCandidate, PromptOptimization
from tracerl.core.errors import InputError
from tracerl.core.policy import Policy
from tracerl.core.trajectory import Trajectory
from tracerl.envs.base import Env
from tracerl.envs.prompted import SystemPromptEnv
from tracerl.envs.runner import Episode, rollout

COMPONENT = "system_prompt"


@dataclass
class Reflection:
    """The reflection model: an OpenAI-compatible chat endpoint, as GEPA's `LanguageModel` (prompt -> text)."""

    base_url: str
    model: str
    api_key: str
    temperature: float
    max_tokens: int
    seed: int
    calls: int = 0
    client: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.client = OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=3, timeout=600)

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        reply = self.client.chat.completions.create(model=self.model, messages=messages, temperature=self.temperature,
                                                    max_tokens=self.max_tokens, seed=self.seed + self.calls)
        self.calls += 1
        return reply.choices[0].message.content or ""


class RolloutAdapter:
    """GEPA's adapter: a candidate prompt played with tracerl's rollout runner on task seeds of the target.

    `rollouts` counts every episode played; `budget` is never exceeded (`evaluate` refuses a batch
    that would, which GEPA's stopper, `fits_another_iteration`, keeps from happening)."""

    def __init__(self, make_env: Callable[[], Env], policy: Policy, *, budget: int, batch_size: int,
                 transcript_chars: int, on_rollout: Callable[[int], None] | None = None):
        self.make_env = make_env
        self.policy = policy
        self.budget = budget
        self.batch_size = batch_size
        self.transcript_chars = transcript_chars
        self.on_rollout = on_rollout
        self.rollouts = 0

    def evaluate(self, batch: list[int], candidate: dict[str, str], capture_traces: bool = False) -> EvaluationBatch:
        if self.rollouts + len(batch) > self.budget:
            raise RuntimeError(f"GEPA asked for {len(batch)} more rollouts with {self.budget - self.rollouts} "
                               "left of its budget")
        prompt = candidate[COMPONENT]
        trajectories = rollout(lambda: SystemPromptEnv(self.make_env(), prompt), self.policy,
                               [Episode(seed=s) for s in batch], batch_size=self.batch_size)
        self.rollouts += len(trajectories)
        if self.on_rollout is not None:
            self.on_rollout(self.rollouts)
        return EvaluationBatch(outputs=[{"task_id": t.task_id, "reward": t.reward, "passed": t.passed}
                                        for t in trajectories],
                               scores=[float(t.reward) for t in trajectories],
                               trajectories=trajectories if capture_traces else None)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: EvaluationBatch,
                                components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
        records = [{"Task": opening(t), "Agent's conversation": transcript(t, self.transcript_chars),
                    "Feedback": feedback(t)} for t in eval_batch.trajectories or []]
        return {name: records for name in components_to_update}

    propose_new_texts = None


def fits_another_iteration(adapter: RolloutAdapter, minibatch: int, val_tasks: int) -> Callable[[Any], bool]:
    """GEPA's stopper: stop when one more iteration (parent and child on a minibatch, then the child on
    the validation set) could take the rollouts past the budget."""

    def stop(_state: Any) -> bool:
        return adapter.rollouts + 2 * minibatch + val_tasks > adapter.budget

    return stop


# --- what the reflection model reads ----------------------------------------------------------

def opening(t: Trajectory) -> str:
    """The user's first words."""
    return next((m.content or "" for m in t.messages if m.role == "user"), "")


def transcript(t: Trajectory, limit: int) -> str:
    """The conversation after the system prompt, one line per message, cut to `limit` characters."""
    lines = []
    for m in t.messages[1:]:
        if m.role == "assistant":
            calls = [f"{c.function.name}({c.function.arguments})" for c in m.tool_calls or []]
            lines.append("agent: " + " ".join(filter(None, [m.content or "", *calls])))
        elif m.role == "tool":
            lines.append(f"tool {m.name}: {_cut(m.content or '', 300)}")
        else:
            lines.append(f"{m.role}: {m.content or ''}")
    return _cut("\n".join(lines), limit)


def feedback(t: Trajectory) -> str:
    """The grader's verdict: reward, pass or fail, how the episode ended, the reward's parts and, where
    the target states them, the calls that solve the task."""
    parts = [f"reward {t.reward:.3g} ({'passed' if t.passed else 'failed'}), ended by {t.termination}"]
    if t.reward_breakdown:
        parts.append("reward parts: " + ", ".join(f"{k} {v:.3g}" for k, v in t.reward_breakdown.items()))
    error = t.info.get("toolsandbox_error") or t.info.get("tau2_error") or t.info.get("error")
    if error:
        parts.append(f"error: {error}")
    gold = t.info.get("gold_actions")
    if gold:
        parts.append("expected calls: " + "; ".join(f"{a['name']}({json.dumps(a.get('arguments', {}), sort_keys=True)})"
                                                   for a in gold))
    return ". ".join(parts)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the stage -------------------------------------------------------------------------------

def seed_prompt(trajectories: Sequence[Trajectory]) -> str:
    """The target's system prompt, from its episodes; one line when they do not all open with the same one."""
    prompts = {t.messages[0].content or "" for t in trajectories if t.messages and t.messages[0].role == "system"}
    if len(prompts) != 1:
        raise InputError(f"gepa optimises one system prompt; the target's collected episodes open with {len(prompts)} "
                         "different ones")
    return prompts.pop()


def run_gepa(*, make_env: Callable[[], Env], policy: Policy, config: GepaConfig, budget: int, reflection: Reflection,
             seed_text: str, seed: int, curve_seeds: list[int], batch_size: int,
             on_rollout: Callable[[int], None] | None = None,
             log: Callable[[str], None] | None = None) -> PromptOptimization:
    """Optimise the system prompt with `gepa.optimize` within `budget` rollouts on the target's train
    split (`make_env`; its first train_tasks + val_tasks tasks that are not in `curve_seeds`), then play
    each running-best candidate on `curve_seeds`."""
    minibatch = config.reflection_minibatch_size
    needed = config.val_tasks + 2 * minibatch
    if budget < needed:
        raise InputError(f"gepa: a budget of {budget} rollouts is less than one GEPA iteration needs (val_tasks "
                         f"{config.val_tasks} + 2 × reflection_minibatch_size {minibatch} = {needed})")
    probe = make_env()
    try:
        seeds = probe.task_seeds(config.train_tasks + config.val_tasks + len(curve_seeds))
    except ValueError:
        try:  # a finite split: as many as it has
            seeds = probe.task_seeds(config.train_tasks + config.val_tasks)
        except ValueError as e:
            raise InputError(f"gepa: train_tasks + val_tasks: {e}") from None
    held = set(curve_seeds)
    seeds = [s for s in seeds if s not in held][:config.train_tasks + config.val_tasks]
    if len(seeds) < config.train_tasks + config.val_tasks:
        raise InputError(f"gepa: the train split has {len(seeds)} tasks outside the curve's validation episodes; "
                         f"train_tasks + val_tasks is {config.train_tasks + config.val_tasks}")
    train_seeds, val_seeds = seeds[:config.train_tasks], seeds[config.train_tasks:]
    adapter = RolloutAdapter(make_env, policy, budget=budget, batch_size=batch_size,
                             transcript_chars=config.transcript_chars, on_rollout=on_rollout)
    lines: list[str] = []

    class Log:
        def log(self, message: str) -> None:
            lines.append(str(message))
            if log is not None:
                log(str(message))

    result = gepa.optimize(
        seed_candidate={COMPONENT: seed_text}, trainset=train_seeds, valset=val_seeds, adapter=adapter,
        reflection_lm=reflection, candidate_selection_strategy=config.candidate_selection_strategy,
        reflection_minibatch_size=minibatch, stop_callbacks=[fits_another_iteration(adapter, minibatch, config.val_tasks)],
        logger=Log(), seed=seed, track_best_outputs=False, display_progress_bar=False, raise_on_exception=True)
    candidates = [PromptCandidate(prompt=c[COMPONENT], parents=[p for p in parents if p is not None],
                                  val_score=float(score), discovered_at=int(at))
                  for c, parents, score, at in zip(result.candidates, result.parents, result.val_aggregate_scores,
                                                   result.discovery_eval_counts, strict=True)]
    if config.curve_points and curve_seeds:
        best = candidates[0].val_score  # the seed prompt's validation success is the base model's
        for c in candidates[1:]:
            if c.val_score > best:  # a new running best, in the order GEPA found them
                played = rollout(lambda prompt=c.prompt: SystemPromptEnv(make_env(), prompt), policy,
                                 [Episode(seed=s) for s in curve_seeds], batch_size=batch_size)
                c.curve_passed, c.curve_episodes = sum(t.passed for t in played), len(played)
                best = c.val_score
    return PromptOptimization(
        optimizer=f"gepa {version('gepa')}", reflection={"base_url": reflection.base_url, "model": reflection.model},
        budget=budget, rollouts_used=adapter.rollouts, train_seeds=train_seeds, val_seeds=val_seeds,
        reflection_minibatch_size=minibatch, reflection_calls=reflection.calls, seed_prompt=seed_text,
        candidates=candidates, best=result.best_idx, curve_seeds=curve_seeds if config.curve_points else [],
        log="\n".join(lines))
