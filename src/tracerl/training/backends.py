"""The trainer's local rollout backend: the policy samples with the live PEFT model, so a step's update is
visible to the next rollouts at once. Rollouts from servers that hot-swap the adapter after every step:
`tracerl.models.served.ServerBackend`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracerl.core.policy import Policy

PolicyFactory = Callable[[bool, int], Policy]  # (greedy, seed) -> policy


@dataclass
class LocalBackend:
    """Rollouts from the model being trained (same process, same weights)."""

    make_policy: PolicyFactory
    adapter: str = "default"  # the PEFT adapter the sessions sample with
    needs_adapter_files = False  # the policy samples with the live weights
    samples_with_model = True

    def policy(self, *, greedy: bool, seed: int) -> Policy:
        return self.make_policy(greedy, seed)

    def after_step(self, adapter_dir: Path) -> None:
        """Nothing to do: the policy samples with the live weights."""

    def follow_after_step(self) -> None:
        """Nothing: `after_step` runs no forward."""
