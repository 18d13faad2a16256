"""`tracerl report --workspace DIR [--open] [--json]`: the HTML report of a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from tracerl.contracts import ReportSummary


def report(
    workspace: Path = typer.Option(..., "--workspace", "-w", help="The run's workspace folder."),
    open_browser: bool = typer.Option(False, "--open", help="Open the report in a web browser."),
    as_json: bool = typer.Option(False, "--json", help="Print report.json on stdout instead of a table."),
) -> None:
    """Write <workspace>/report/index.html (self-contained), its PNG figures and report.json."""
    import webbrowser

    from rich.console import Console

    from tracerl.core.io import check_output
    from tracerl.evaluation.report import build_report

    if workspace.is_dir():  # (a missing workspace: build_report says so)
        check_output(workspace / "report", folder=True, what="the report folder")
    result = build_report(workspace)
    if as_json:
        typer.echo(json.dumps(result.summary.model_dump(mode="json"), indent=2, ensure_ascii=False))
    else:
        print_headline(result.summary, Console())
    err = Console(stderr=True)
    err.print(f"report: {result.html_path}", highlight=False, soft_wrap=True)
    if open_browser and not webbrowser.open(result.html_path.resolve().as_uri()):
        err.print("could not start a web browser; open the file above by hand", highlight=False)


def print_headline(summary: ReportSummary, console) -> None:
    """A rich table of the evaluation (pass^1 with interval, difference vs base, rollouts) and what is missing."""
    from rich.table import Table

    if summary.evaluation:
        table = Table(title="Evaluation on held-out test tasks")
        for column in ("variant", "pass^1", "95% CI", "vs base", "rollouts"):
            table.add_column(column, justify="left" if column == "variant" else "right", overflow="fold")
        trace = summary.headline.trace.variant if summary.headline.trace else None
        for name, e in summary.evaluation.items():
            p, d = e.pass1, e.diff_vs_base
            table.add_row(name, f"{p.mean * 100:.1f}%", f"[{p.low * 100:.1f}, {p.high * 100:.1f}]",
                          f"{d.mean * 100:+.1f}" if d and name != "base" else "—",
                          f"{e.rollouts_used:,}", style="bold" if name == trace else None)
        console.print(table)
    if summary.routing_accuracy is not None:
        console.print(f"routing accuracy: {summary.routing_accuracy * 100:.1f}%")
    for section, why in summary.missing.items():
        console.print(f"[dim]{section}: {why}[/]", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `tracerl report` to the app."""
    app.command("report")(report)
