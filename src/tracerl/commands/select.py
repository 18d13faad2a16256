"""`tracerl select`: TRACE step 1 — contrastive capability selection over a rollouts file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from tracerl.commands import analysis as opt

if TYPE_CHECKING:
    from tracerl.contracts import CapabilitiesFile


def select(
    rollouts: Path = typer.Option(..., "--rollouts", help="Our JSONL, a τ²-bench results JSON or a ToolSandBox run folder (its result_summary.json)."),
    labeler: str = typer.Option("rules", "--labeler", help="rules (deterministic, offline) or llm (OpenAI-compatible endpoint)."),
    runs: int = typer.Option(10, "--runs", help="N: labelling runs."),
    min_runs: Optional[int] = typer.Option(None, "--min-runs", help="K: runs a capability must pass (default round(0.8·N))."),
    rho: float = typer.Option(0.10, "--rho", help="ρ: minimum coverage."),
    delta: float = typer.Option(0.20, "--delta", help="δ: minimum contrastive gap."),
    capabilities: Optional[Path] = typer.Option(None, "--capabilities", help="YAML/JSON file of your own capabilities (one named as a built-in replaces it)."),
    discover: bool = typer.Option(False, "--discover", help="Ask the LLM to propose capabilities and add them."),
    max_selected: Optional[int] = typer.Option(None, "--max-selected", help="Keep at most this many selected (by mean Δ)."),
    out: Path = typer.Option(Path("selection"), "--out", help="Output folder."),
    tools: Optional[Path] = typer.Option(None, "--tools", help="tools.json for τ²-bench files without tool schemas."),
    bootstrap: int = typer.Option(1000, "--bootstrap", help="Bootstrap resamples for the 95% intervals (0: none)."),
    seed: int = typer.Option(0, "--seed", help="Seed of run 0 (run r uses seed+r) and of the bootstrap."),
    analysis_base_url: Optional[str] = opt.BASE_URL,
    analysis_model: Optional[str] = opt.MODEL,
    analysis_api_key_env: Optional[str] = opt.API_KEY_ENV,
    analysis_temperature: Optional[float] = opt.TEMPERATURE,
    analysis_concurrency: Optional[int] = opt.CONCURRENCY,
    analysis_timeout: Optional[float] = opt.TIMEOUT,
    analysis_max_retries: Optional[int] = opt.MAX_RETRIES,
    analysis_config: Optional[Path] = opt.CONFIG,
    as_json: bool = typer.Option(False, "--json", help="Print capabilities.json on stdout."),
) -> None:
    """Find the capabilities whose absence explains the agent's failures (Cov, Δ, K-of-N)."""
    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import Progress

    from tracerl.core.errors import InputError
    from tracerl.core.io import check_output, describe_validation_error
    from tracerl.envs.loading import load_rollouts
    from tracerl.selection.stage import SelectConfig, progress_steps, run_select

    try:
        config = SelectConfig(labeler=labeler, runs=runs, min_runs=min_runs, rho=rho, delta=delta, bootstrap=bootstrap,
                              capabilities=None if capabilities is None else str(capabilities), discover=discover,
                              max_selected=max_selected)
    except ValidationError as e:
        raise InputError(describe_validation_error(e)) from None
    trajectories = load_rollouts(rollouts, tools=tools)
    check_output(out, folder=True)
    llm = opt.analysis_config(analysis_config, base_url=analysis_base_url, model=analysis_model,
                              api_key_env=analysis_api_key_env, temperature=analysis_temperature,
                              concurrency=analysis_concurrency, timeout=analysis_timeout, max_retries=analysis_max_retries)
    err = Console(stderr=True)
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task(f"labelling ({labeler})", total=progress_steps(config, len(trajectories)))
        result = run_select(trajectories, config, seed=seed, out_dir=out, llm=llm,
                            on_step=lambda: progress.advance(task))
    if result.analysis is not None:
        err.print(f"analysis model: {result.analysis}", highlight=False, soft_wrap=True)
    if result.problems:
        err.print(f"[yellow]{len(result.problems)} labelling requests failed (pairs left unlabelled), e.g. "
                  f"{result.problems[0]}[/]", highlight=False, soft_wrap=True)
    if as_json:
        typer.echo(json.dumps(result.document.model_dump(mode="json"), indent=2, ensure_ascii=False))
    else:
        print_table(result.document, out)


def print_table(document: CapabilitiesFile, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    p, totals = document.params, document.totals
    table = Table(title=f"capability selection — {totals.failed} failed / {totals.passed} passed; "
                        f"ρ={p.rho:g} δ={p.delta:g} K={p.k} of N={p.n}")
    console = Console()
    wide = console.width >= 120  # the intervals and notes only where they fit
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("capability", overflow="fold")
    table.add_column("Cov", justify="right", no_wrap=True)
    table.add_column("Δ", justify="right", no_wrap=True)
    table.add_column("runs", justify="right", no_wrap=True)
    table.add_column("selected", justify="center", no_wrap=True)
    if wide:
        table.add_column("Cov 95% CI", justify="right", no_wrap=True)
        table.add_column("Δ 95% CI", justify="right", no_wrap=True)
        table.add_column("note", overflow="fold")
    for c in document.capabilities:
        notes = []
        if c.decoy:
            notes.append("decoy")
        if c.er_plus_flag:
            notes.append(f"ER+ empty in {c.er_plus_empty_runs} runs")
        if c.unlabelled_pairs:
            notes.append(f"{c.unlabelled_pairs} unlabelled")
        row = [str(c.rank), c.name, _num(c.mean_cov, "{:.2f}"), _num(c.mean_delta, "{:+.2f}"),
               f"{c.runs_passed}/{c.runs_total}", "[green]yes[/]" if c.selected else "no"]
        if wide:
            row += [_ci(c.cov_ci95), _ci(c.delta_ci95), "; ".join(notes)]
        table.add_row(*row)
    console.print(table)
    console.print(f"labeler {document.labeler.name}: {document.labeler.note}")
    if document.unlabelled_pairs:
        console.print(f"[yellow]{document.unlabelled_pairs} pairs unlabelled (excluded from counts); see {out}/labels/[/]")
    console.print(f"wrote {out}/capabilities.json and {out}/labels/")


def _ci(ci: tuple[float | None, float | None]) -> str:
    return "" if ci[0] is None or ci[1] is None else f"[{ci[0]:.2f},{ci[1]:.2f}]"


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else fmt.format(x)


def register(app: typer.Typer) -> None:
    app.command("select")(select)
