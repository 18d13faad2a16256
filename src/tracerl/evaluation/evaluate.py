"""`tracerl eval`: a variant's pass rate on the target's held-out tasks, with intervals and a breakdown.

One variant = one policy (and adapter) played greedily on the first `tasks` test seeds, `trials`
times each. The result file holds pass^1 with a 95% bootstrap interval over tasks, pass^k for
k ≤ trials, the paired difference against the base model when its result is given, the rollouts
the variant consumed in training, and which capabilities the rules labeller still finds LACKING
in the failures (counted by the function the caller gives: the rules labeller's, in a run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tracerl.contracts import Capability, EvalResult, Grading
from tracerl.core.messages import Message
from tracerl.core.policy import Policy, Session
from tracerl.core.trajectory import Trajectory
from tracerl.envs.base import Env
from tracerl.envs.runner import Episode, rollout
from tracerl.evaluation.stats import (
    bootstrap_mean,
    paired_difference,
    pass_hat_k,
    per_task_pass_rate,
    successes_by_task,
)


def play(make_env: Callable[[], Env], policy: Policy, seeds: Sequence[int], *, trials: int = 1,
         adapter: str | None = None, batch_size: int = 64,
         on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    episodes = [Episode(seed=s, adapter=adapter) for s in seeds for _ in range(trials)]
    return rollout(make_env, policy, episodes, batch_size=batch_size, on_done=on_done)


FailureCounter = Callable[[Sequence[Trajectory]], dict[str, int]]


def summarize_variant(variant: str, trajectories: Sequence[Trajectory], *, rollouts_used: int,
                      count_failures: FailureCounter | None = None, base: EvalResult | None = None,
                      bootstrap: int = 2000, seed: int = 0) -> EvalResult:
    """The `eval/<variant>.json` content; `count_failures` counts, per selected capability, the failed
    trajectories that lack it (the pipeline passes the rules labeller's count)."""
    per_task = per_task_pass_rate(trajectories)
    counts = list(successes_by_task(trajectories).values())
    trials = min(n for n, _ in counts) if counts else 0
    ks = [k for k in (1, 2, 4, 8, 16) if k <= trials]
    return EvalResult(
        variant=variant,
        pass1=bootstrap_mean(list(per_task.values()), seed=seed, resamples=bootstrap),
        pass_k={str(k): pass_hat_k(counts, k) for k in ks},
        diff_vs_base=None if base is None or variant == "base" else
        paired_difference(per_task, base.per_task, seed=seed, resamples=bootstrap),
        rollouts_used=int(rollouts_used),
        n_tasks=len(per_task),
        trials=trials,
        mean_reward=sum(t.reward for t in trajectories) / max(1, len(trajectories)),
        failures_by_capability=count_failures(trajectories) if count_failures is not None else {},
        per_task=per_task,
        grading=grading_of(trajectories),
    )


def grading_of(trajectories: Sequence[Trajectory]) -> Grading | None:
    """How a live target (τ²-bench, ToolSandBox) graded these episodes (each records it in its info); None otherwise."""
    sandbox = [t.info for t in trajectories if t.info.get("source") == "toolsandbox-live"]
    if sandbox:
        return Grading(grader=f"ToolSandBox {sandbox[0].get('toolsandbox_version') or '(version unknown)'}",
                       reward_basis=["milestone similarity", "minefields"],
                       user_simulator=sandbox[0].get("user_simulator"), judge=None)
    live = [t.info for t in trajectories if t.info.get("source") == "tau2-live"]
    if not live:
        return None
    return Grading(grader=f"τ²-bench {live[0].get('tau2_version') or '(version unknown)'}",
                   reward_basis=sorted({b for info in live for b in info.get("reward_basis", [])}),
                   user_simulator=live[0].get("user_simulator"), judge=live[0].get("judge"))


class WithSystemNote:
    """A policy whose system prompt carries an extra note (the 'prompting with capability
    descriptions' baseline). The note is added before the model first sees the conversation, so the
    trajectory records exactly the prompt the model was given."""

    def __init__(self, inner: Policy, note: str):
        self.inner = inner
        self.note = note
        self.name = f"{inner.name}+note"

    def act(self, sessions: list[Session]) -> list[Message]:
        suffix = f"\n\n{self.note}"
        for s in sessions:
            system = s.messages[0] if s.messages and s.messages[0].role == "system" else None
            if system is not None and not (system.content or "").endswith(suffix):
                s.messages[0] = system.model_copy(update={"content": f"{system.content}{suffix}"})
        return self.inner.act(sessions)


def capability_note(capabilities: Sequence[Capability]) -> str:
    lines = ["Take special care with:"] + [f"- {c.description}" for c in capabilities]
    return "\n".join(lines)
