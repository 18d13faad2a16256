"""`tracerl envs` (the environments this installation knows) and `tracerl tools` (an environment's tool
schemas as a tools.json, the format synthesis reads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def envs(as_json: bool = typer.Option(False, "--json", help="Print {name: where it comes from} as JSON.")) -> None:
    """List the environments `target.env` and `--env` accept: built-in, installed (entry points of the group
    `tracerl.envs`), τ²-bench's; any `package.module:factory` on the Python path works too."""
    from rich.console import Console
    from rich.table import Table

    from tracerl.envs.registry import available_envs

    found = available_envs()
    if as_json:
        typer.echo(json.dumps(found, indent=2, ensure_ascii=False))
        return
    table = Table(title="environments")
    table.add_column("name", no_wrap=True)
    table.add_column("from")
    for name, source in found.items():
        table.add_row(name, source)
    table.add_row("package.module:factory", "any factory on the Python path that returns a tracerl.envs.base.Env")
    Console().print(table)


def tools(
    env: str = typer.Option(..., "--env", help="An environment: a name from `tracerl envs` or package.module:factory."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the tools.json here (default: print it)."),
) -> None:
    """Export an environment's tool schemas, with their read / write / generic kinds, as a τ²-bench-style
    tools.json (what `tracerl synthesize --target FILE` and `target.tools` read)."""
    from rich.console import Console

    from tracerl.core.io import atomic_write_text
    from tracerl.core.tools import tools_json
    from tracerl.envs.registry import make_env

    schemas = make_env(env).tools
    text = json.dumps(tools_json(list(schemas)), indent=2, ensure_ascii=False) + "\n"
    if out is None:
        typer.echo(text, nl=False)
        return
    atomic_write_text(out, text)
    kinds = {k: sum(t.kind == k for t in schemas) for k in ("read", "write", "generic")}
    Console(stderr=True).print(f"wrote {out}: {len(schemas)} tools ({kinds['read']} read, {kinds['write']} write, "
                               f"{kinds['generic']} generic)", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("envs")(envs)
    app.command("tools")(tools)
