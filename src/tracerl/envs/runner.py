"""Run policies in environments: batched episodes that become `Trajectory` records.

A policy with `turns(max_rows)` returning a continuous batch (`LocalPolicy`, see
`tracerl.models.continuous.PolicyTurns`) plays up to `batch_size` episodes at once through it: a
turn that ends leaves the batch, the environment answers at once, and the episode's next turn (or
the next episode) joins at the next step. Any other policy plays chunks of `batch_size` episodes in
lockstep, one `act` call per turn of every live episode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.core.messages import Message
from tracerl.core.policy import Policy, Session
from tracerl.core.trajectory import Trajectory
from tracerl.envs.base import Env

PASS_TOLERANCE = 1e-6


@dataclass
class Episode:
    seed: int
    options: dict[str, Any] = field(default_factory=dict)
    adapter: str | None = None


def passed(reward: float) -> bool:
    """τ²-bench's rule: an episode passes iff its reward is 1 (within 1e-6)."""
    return abs(reward - 1.0) <= PASS_TOLERANCE


def rollout(
    make_env: Callable[[], Env],
    policy: Policy,
    episodes: Sequence[Episode],
    *,
    batch_size: int = 64,
    on_done: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Play `episodes` (up to `batch_size` at a time, one env each); trajectories in input order."""
    make_turns = getattr(policy, "turns", None)
    turns = make_turns(batch_size) if callable(make_turns) and episodes else None
    if turns is not None:
        return _rollout_continuous(make_env, turns, episodes, on_done)
    results: list[Trajectory | None] = [None] * len(episodes)
    for start in range(0, len(episodes), batch_size):
        chunk = range(start, min(start + batch_size, len(episodes)))
        envs = {i: make_env() for i in chunk}
        sessions: dict[int, Session] = {}
        for i in chunk:
            messages, info = envs[i].reset(seed=episodes[i].seed, options=episodes[i].options)
            sessions[i] = _session(envs[i], episodes[i], messages, info)
        active = list(chunk)
        while active:
            replies = policy.act([sessions[i] for i in active])
            still = []
            for i, reply in zip(active, replies, strict=True):
                results[i] = _advance(envs[i], episodes[i], sessions[i], reply)
                if results[i] is not None:
                    if on_done is not None:
                        on_done(results[i])
                else:
                    still.append(i)
            active = still
    return [r for r in results if r is not None]


def _advance(env: Env, episode: Episode, session: Session, reply: Message) -> Trajectory | None:
    """Play the policy's reply in the environment; the finished trajectory when the episode ended."""
    session.messages.append(reply)
    new, reward, terminated, truncated, step_info = env.step(reply)
    session.messages.extend(new)
    return _trajectory(env, episode, session, reward, step_info) if terminated or truncated else None


def _rollout_continuous(make_env: Callable[[], Env], turns: Any, episodes: Sequence[Episode],
                        on_done: Callable[[Trajectory], None] | None) -> list[Trajectory]:
    """Episodes enter in order as others end (so sessions are numbered, and seeded, as in lockstep)."""
    results: list[Trajectory | None] = [None] * len(episodes)
    envs: dict[int, Env] = {}
    sessions: dict[int, Session] = {}
    upcoming = iter(range(len(episodes)))

    def admit() -> None:
        while len(envs) < turns.max_rows and (i := next(upcoming, None)) is not None:
            envs[i] = make_env()
            messages, info = envs[i].reset(seed=episodes[i].seed, options=episodes[i].options)
            sessions[i] = _session(envs[i], episodes[i], messages, info)
            turns.submit(i, sessions[i])

    admit()
    while envs:
        if not turns.busy:
            raise RuntimeError("a live episode has no turn queued")
        for i, reply in turns.step():
            results[i] = _advance(envs[i], episodes[i], sessions[i], reply)
            if results[i] is not None:
                turns.release(i)
                del envs[i], sessions[i]
                if on_done is not None:
                    on_done(results[i])
            else:
                turns.submit(i, sessions[i])
        admit()
    return [r for r in results if r is not None]


def _session(env: Env, episode: Episode, messages: list[Message], info: dict[str, Any]) -> Session:
    return Session(messages=list(messages), tools=env.tools, info=info, seed=episode.seed, options=dict(episode.options),
                   adapter=episode.adapter)


def _trajectory(env: Env, episode: Episode, session: Session, reward: float, step_info: dict[str, Any]) -> Trajectory:
    public = {k: v for k, v in session.info.items() if k != "task_id"}
    public.update(step_info.get("trajectory_info") or {})  # what the environment records once the episode is over
    if episode.options.get("hint"):
        public["hint"] = True
    return Trajectory(
        task_id=str(session.info.get("task_id", episode.seed)),
        domain=env.name,
        seed=episode.seed,
        messages=session.messages,
        tools=session.tools,
        reward=float(reward),
        passed=passed(reward),
        reward_breakdown=step_info.get("reward_breakdown", {}),
        termination=step_info.get("termination") or "error",
        info=public,
        tokens=session.tokens,
    )
