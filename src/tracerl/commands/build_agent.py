"""`tracerl build-agent --recipe FILE`: make a tiny agent (tokenizer + SFT on a domain teacher's demonstrations)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tracerl.core.errors import InputError


SHIPPED_RECIPE = Path(__file__).resolve().parents[1] / "models" / "tiny_agent" / "build.json"


def build_agent_command(
    recipe: Annotated[Path, typer.Option(help="The build's recipe: a JSON file of AgentRecipe fields, or a build.json "
                                              "(its 'recipe'); the default rebuilds the shipped agent.")] = SHIPPED_RECIPE,
    out: Annotated[Path, typer.Option(help="Output directory (the shipped agent lives in src/tracerl/models/tiny_agent).")] = Path("tiny_agent"),
    device: Annotated[str, typer.Option(help="torch device to train on (e.g. cuda); the agent is saved and tested on the CPU.")] = "cpu",
    json_output: Annotated[bool, typer.Option("--json", help="Print build.json on stdout.")] = False,
) -> None:
    """Train the tokenizer and the tiny Qwen3 agent on a domain teacher's demonstrations, as the recipe says;
    write model + build.json (the recipe included, so `--recipe OUT/build.json` builds it again)."""
    from tracerl.models.build_agent import build_agent, load_recipe

    plan = load_recipe(recipe)
    plan.teacher()  # a bad domain or teacher spec fails before anything runs
    check_device(device)
    from tracerl.core.io import check_output

    check_output(out, folder=True)
    command = "tracerl " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["build-agent"] else "tracerl build-agent"
    console = Console(stderr=True)
    with Progress(TextColumn("build-agent"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=json_output) as bar:
        task = bar.add_task("sft", total=plan.max_steps + plan.drill_steps, loss="-")
        report = build_agent(out, plan, command=command, device=device, log=lambda m: console.print(m, highlight=False),
                             progress=lambda i, n, loss: bar.update(task, completed=i, total=n, loss=f"{loss:.3f}"))
    if json_output:
        typer.echo(json.dumps(report, indent=2))
        return
    table = Table(title=f"tiny agent → {out}")
    table.add_column("")
    table.add_column("value", justify="right")
    rows = [("parameters", f"{report['model']['parameters']:,}"), ("vocabulary", str(report["model"]["vocab_size"])),
            ("demonstrations", str(report["data"]["episodes"])), ("teacher pass rate", f"{report['data']['teacher_pass_rate']:.1%}"),
            ("training tokens/s", f"{report['training']['tokens_per_second']:,.0f}"), ("minutes", str(report["minutes"])),
            ("test greedy pass rate", f"{report['test']['greedy_pass_rate']:.1%} of {report['test']['tasks']}"),
            ("sampling tokens/s", f"{report['test']['sampling_tokens_per_second']:,.0f}")]
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)


def check_device(device: str) -> None:
    """A clear error for a device torch does not know or this machine does not have."""
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise InputError(f"--device '{device}' is not a torch device ({exc})") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device '{device}': this machine has no CUDA device")


def register(app: typer.Typer) -> None:
    app.command("build-agent")(build_agent_command)
