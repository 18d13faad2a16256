"""`tracerl select`: TRACE step 1 — contrastive capability selection over a rollouts file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

if TYPE_CHECKING:
    from tracerl.contracts import CapabilitiesFile


def select(
    rollouts: Path = typer.Option(..., "--rollouts", help="Our JSONL or a τ²-bench results JSON."),
    labeler: str = typer.Option("rules", "--labeler", help="rules (deterministic, offline) or llm (OpenAI-compatible endpoint)."),
    runs: int = typer.Option(10, "--runs", help="N: labelling runs."),
    min_runs: Optional[int] = typer.Option(None, "--min-runs", help="K: runs a capability must pass (default round(0.8·N))."),
    rho: float = typer.Option(0.10, "--rho", help="ρ: minimum coverage."),
    delta: float = typer.Option(0.20, "--delta", help="δ: minimum contrastive gap."),
    capabilities: Optional[Path] = typer.Option(None, "--capabilities", help="YAML/JSON file of your own capabilities."),
    discover: bool = typer.Option(False, "--discover", help="Ask the LLM to propose capabilities and add them."),
    out: Path = typer.Option(Path("selection"), "--out", help="Output folder."),
    tools: Optional[Path] = typer.Option(None, "--tools", help="tools.json for τ²-bench files without tool schemas."),
    bootstrap: int = typer.Option(1000, "--bootstrap", help="Bootstrap resamples for the 95% intervals (0: none)."),
    seed: int = typer.Option(0, "--seed", help="Seed of run 0 (run r uses seed+r) and of the bootstrap."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="LLM endpoint (default $OPENAI_BASE_URL)."),
    model: Optional[str] = typer.Option(None, "--model", help="LLM model (default $TRACERL_LLM_MODEL / $OPENAI_MODEL)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="API key (default $OPENAI_API_KEY)."),
    temperature: float = typer.Option(0.7, "--temperature", help="LLM sampling temperature (> 0)."),
    concurrency: int = typer.Option(8, "--concurrency", help="LLM requests in flight at most."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds per LLM request."),
    max_retries: int = typer.Option(3, "--max-retries", help="Retries per LLM request (exponential backoff)."),
    as_json: bool = typer.Option(False, "--json", help="Print capabilities.json on stdout."),
) -> None:
    """Find the capabilities whose absence explains the agent's failures (Cov, Δ, K-of-N)."""
    from rich.console import Console
    from rich.progress import Progress

    from tracerl.core.errors import InputError
    from tracerl.envs.loading import load_rollouts
    from tracerl.selection.aggregate import SelectionParams
    from tracerl.selection.catalogue import builtin_capabilities, load_capabilities, merge_capabilities
    from tracerl.selection.select import select_capabilities

    if labeler not in ("rules", "llm"):
        raise InputError(f"--labeler must be 'rules' or 'llm', not '{labeler}'")
    params = SelectionParams(rho=rho, delta=delta, runs=runs, min_runs=min_runs, bootstrap=bootstrap, seed=seed)
    if runs < 1 or not 1 <= params.k <= runs or bootstrap < 0:
        raise InputError(f"need N ≥ 1, 1 ≤ K ≤ N and bootstrap ≥ 0 (got N={runs}, K={params.k}, bootstrap={bootstrap})")
    trajectories = load_rollouts(rollouts, tools=tools)
    catalogue = builtin_capabilities()
    if capabilities is not None:
        user = load_capabilities(capabilities)
        by_name = {c.name: c for c in user}
        catalogue = merge_capabilities([by_name.pop(c.name, c) for c in catalogue], list(by_name.values()))
    llm_config = None
    if labeler == "llm" or discover:
        from tracerl.selection.llm import LLMConfig

        if temperature <= 0 and labeler == "llm":
            raise InputError("--temperature must be > 0: the N runs must be independent samples")
        llm_config = LLMConfig(base_url=base_url, model=model, api_key=api_key, temperature=temperature,
                               concurrency=concurrency, timeout=timeout, max_retries=max_retries).resolved()
    err = Console(stderr=True)
    if discover:
        from tracerl.selection.discovery import discover as run_discovery
        from tracerl.selection.llm import ChatClient

        with err.status("discovering capabilities"):
            found = run_discovery(ChatClient(llm_config), trajectories, seed=seed)  # type: ignore[arg-type]
        catalogue = merge_capabilities(catalogue, found)
    if labeler == "rules":
        from tracerl.selection.rules import RulesLabeller

        the_labeller: Any = RulesLabeller()
    else:
        from tracerl.selection.llm import LLMLabeller

        the_labeller = LLMLabeller(llm_config)  # type: ignore[arg-type]
    steps = len(trajectories) * (1 if the_labeller.deterministic else runs)
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task(f"labelling ({labeler})", total=steps if not the_labeller.deterministic else runs)
        if not the_labeller.deterministic:
            the_labeller.on_progress = lambda: progress.advance(task)
        document, label_sets = select_capabilities(
            trajectories, catalogue, the_labeller, params, out_dir=out,
            on_run=(lambda r: progress.advance(task)) if the_labeller.deterministic else None)
    problems = [p for run in label_sets for p in run.problems]
    if problems:
        err.print(f"[yellow]{len(problems)} labelling requests failed (pairs left unlabelled), e.g. {problems[0]}[/]",
                  highlight=False, soft_wrap=True)
    if as_json:
        typer.echo(json.dumps(document.model_dump(mode="json"), indent=2, ensure_ascii=False))
    else:
        print_table(document, out)


def print_table(document: CapabilitiesFile, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    p, totals = document.params, document.totals
    table = Table(title=f"capability selection — {totals.failed} failed / {totals.passed} passed; "
                        f"ρ={p.rho:g} δ={p.delta:g} K={p.k} of N={p.n}")
    console = Console()
    wide = console.width >= 120  # the intervals and notes only where they fit
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("capability", no_wrap=True)
    table.add_column("Cov", justify="right", no_wrap=True)
    table.add_column("Δ", justify="right", no_wrap=True)
    table.add_column("runs", justify="right", no_wrap=True)
    table.add_column("selected", justify="center", no_wrap=True)
    if wide:
        table.add_column("Cov 95% CI", justify="right", no_wrap=True)
        table.add_column("Δ 95% CI", justify="right", no_wrap=True)
        table.add_column("note")
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
