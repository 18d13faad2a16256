"""`tracerl run`, `tracerl demo` and `tracerl eval`: the pipeline from the command line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from tracerl.core.errors import InputError

console = Console(stderr=True)


def single_process(command: str, config_path: Path, workspace: Path | None) -> None:
    """The pipeline runs in one process: under torchrun (WORLD_SIZE > 1) every rank would run all of it on
    one workspace, so refuse before anything is read or written, naming the command that trains on ranks."""
    import os

    size = os.environ.get("WORLD_SIZE", "1").strip()
    if size in ("", "0", "1"):
        return
    message = f"`tracerl {command}` is single-process (started with WORLD_SIZE={size}): run it without torchrun"
    if command != "eval":
        root = workspace if workspace is not None else "WORKSPACE"
        envs = f"{root}/envs"
        base, server = "BASE", ""
        try:
            from tracerl.config import load_run_config

            model = load_run_config(config_path).model
            base, server = model.base, f" --server {model.server_url}" if model.server_url else ""
        except InputError:
            pass  # the placeholders stand
        message += (f"; to train on {size} ranks set distributed.nproc_per_node: {size} in the config (`tracerl run` "
                    f"then starts torchrun for each training stage), or train into the workspace with `torchrun "
                    f"--nproc_per_node={size} -m tracerl.cli train --all --env {envs} --out {root}/adapters --config "
                    f"{config_path} --base {base}{server}` and rerun `tracerl run`, which takes those adapters up")
    raise InputError(message)


def _run(config_path: Path, workspace: Path | None, force: list[str], only: set[str] | None, as_json: bool,
         command: str = "run", eval_server: str | None = None) -> None:
    single_process(command, config_path, workspace)
    from tracerl.config import load_run_config
    from tracerl.pipeline import Pipeline

    from tracerl.core.io import check_output

    config = load_run_config(config_path)
    if workspace is None:
        raise InputError("give --workspace DIR (the run's folder)")
    check_output(workspace, folder=True, what="--workspace")
    pipeline = Pipeline(config, workspace, console=console, eval_server=eval_server)
    start = time.time()

    def on_stage(name: str, ran: bool, summary: dict) -> None:
        console.print(f"[bold]{name}[/] {'done' if ran else 'up to date (skipped)'}", highlight=False)

    pipeline.run(force=set(force), only=only, on_stage=on_stage)
    table = Table(title=f"tracerl run — {workspace} ({time.time() - start:.0f} s)")
    table.add_column("stage", overflow="fold")
    table.add_column("ran")
    table.add_column("summary", overflow="fold")
    for row in pipeline.log:
        table.add_row(row["stage"], "yes" if row["ran"] else "cached", _brief(row["summary"]))
    report = Path(workspace) / "report" / "index.html"
    if as_json:
        typer.echo(json.dumps({"workspace": str(workspace), "stages": pipeline.log,
                               "report": str(report) if report.exists() else None}, indent=2, default=str))
    else:
        Console().print(table)
    if report.exists():
        console.print(f"report: {report.resolve()}", highlight=False, soft_wrap=True)


def _brief(summary: dict) -> str:
    parts = []
    for key, value in summary.items():
        if isinstance(value, float):
            value = f"{value:.3f}"
        elif isinstance(value, (list, dict)):
            value = json.dumps(value, default=str)
            value = value if len(value) <= 80 else value[:77] + "…"
        parts.append(f"{key}={value}")
    return "  ".join(parts)


def run(
    config: Path = typer.Argument(..., help="Run config (YAML); see configs/ and `tracerl.config`."),
    workspace: Path = typer.Option(..., "--workspace", "-w", help="The run's folder (created; reused to resume)."),
    force: list[str] = typer.Option([], "--force", help="Redo this stage (collect, select, synthesize, train, "
                                    "compose, grpo_target, curve, eval, report, or one like train:CAPABILITY). Repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print the stage log as JSON on stdout."),
) -> None:
    """Run TRACE end to end: collect → select → synthesize → train → compose → curve → eval → report (resumable)."""
    _run(config, workspace, force, None, as_json)


def demo(
    workspace: Path = typer.Option(Path("tracerl-demo"), "--workspace", "-w", help="The run's folder."),
    force: list[str] = typer.Option([], "--force", help="Redo this stage (see `tracerl run --help`)."),
    as_json: bool = typer.Option(False, "--json", help="Print the stage log as JSON on stdout."),
) -> None:
    """`tracerl run` on the embedded default: built-in airline target, the shipped tiny agent, CPU only."""
    from tracerl.config import DEMO_CONFIG

    _run(DEMO_CONFIG, workspace, force, None, as_json, command="demo")


def evaluate(
    workspace: Path = typer.Option(..., "--workspace", "-w", help="A workspace whose training stages are done."),
    force: bool = typer.Option(False, "--force", help="Re-evaluate every variant and TRACE's curve points."),
    server: Optional[str] = typer.Option(None, "--server", help="OpenAI-compatible vLLM server(s) (URL[,URL…]) "
                                         "for the evaluation rollouts, each adapter hot-swapped and checked there "
                                         "(composed variants stay in-process); default: the config's model.server_url"),
    as_json: bool = typer.Option(False, "--json", help="Print the stage log as JSON on stdout."),
) -> None:
    """Evaluate every variant of a run on the held-out test tasks (and TRACE's sample-efficiency points), then
    rebuild the report."""
    single_process("eval", workspace / "config.yaml", workspace)
    config = workspace / "config.yaml"
    if not config.exists():
        raise InputError("not a tracerl workspace (no config.yaml)", path=str(workspace))
    _run(config, workspace, ["curve", "eval"] if force else [], {"curve", "eval", "report"}, as_json, command="eval",
         eval_server=server)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("demo")(demo)
    app.command("eval")(evaluate)
