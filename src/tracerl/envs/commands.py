"""Environment commands: `tracerl collect` (roll a policy out) and `tracerl show` (summarise rollouts)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `tracerl` app."""
