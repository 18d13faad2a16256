"""`Teacher`: what a domain gives an agent builder (`tracerl build-agent`) — its environments by split,
their task seeds, the kind of each tool, and a scripted teacher policy that plays them.

A teacher is any environment's reference policy (`Env.reference_policy(spec, seed, **options)`),
so every domain that has reference policies has one: `tracerl.envs.registry.make_teacher(domain,
policy, **options)` returns it by name. The builder reaches a domain through this interface only.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.core.policy import Policy
from tracerl.core.trajectory import Trajectory
from tracerl.envs.base import Env
from tracerl.envs.runner import Episode, rollout


@dataclass
class Teacher:
    domain: str
    make_env: Callable[[str], Env]  # split ("train" / "test") -> a fresh environment of that split
    policy: str  # the domain's reference policy spec, e.g. "flawed:0.3,0.3,0.6,0.2"
    options: dict[str, Any] = field(default_factory=dict)  # the reference policy's options (airline: rule_check, …)

    def __post_init__(self) -> None:
        self.make_policy(0)  # a spec or an option the domain does not take fails here (ValueError)

    def make_policy(self, seed: int) -> Policy:
        """The teacher policy, its choices seeded by `seed`."""
        return self.make_env("train").reference_policy(self.policy, seed=seed, **self.options)

    def seeds(self, split: str, n: int, offset: int = 0) -> list[int]:
        """The first `n` task seeds of `split` after `offset` (the environment's fixed task set)."""
        return self.make_env(split).task_seeds(n, offset)

    def tool_kinds(self) -> dict[str, str]:
        """Each tool's kind (read / write / generic), by name."""
        return {t.name: t.kind for t in self.make_env("train").tools}

    def demonstrations(self, seeds: Sequence[int], *, seed: int, hinted_share: float = 0.0,
                       split: str = "train") -> list[Trajectory]:
        """The teacher's episodes on `seeds`; a `hinted_share` of them (drawn with `seed`) with the domain's
        expert guidance in the prompt, which the teacher follows."""
        rng = random.Random(f"tracerl-hinted-{seed}")
        episodes = [Episode(seed=s, options={"hint": True} if rng.random() < hinted_share else {}) for s in seeds]
        return rollout(lambda: self.make_env(split), self.make_policy(seed), episodes)
