"""Environment commands: `tracerl collect` (roll a policy out) and `tracerl show` (summarise rollouts)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def show(
    file: Path = typer.Argument(..., help="Rollouts: our JSONL or a τ²-bench results JSON."),
    tools: Optional[Path] = typer.Option(None, "--tools", help="A tools.json (τ²-bench style) for files without tool schemas."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
) -> None:
    """Summarise a rollouts file: count, pass rate, rewards, terminations, tool calls, task kinds."""
    import json

    from rich.console import Console

    from tracerl.envs.loading import load_rollouts
    from tracerl.envs.summary import print_summary, summarize

    summary = summarize(load_rollouts(file, tools=tools), source=str(file))
    if as_json:
        typer.echo(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        print_summary(summary, Console())


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `tracerl` app."""
    app.command("show")(show)
