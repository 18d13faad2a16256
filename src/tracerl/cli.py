"""The `tracerl` command. Each stage module adds its commands here; bad input exits with code 2."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from tracerl.core.errors import InputError

app = typer.Typer(
    name="tracerl",
    help="TRACE: find the capabilities an agent lacks, train one LoRA adapter per capability, compose them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)


def _register_commands() -> None:
    from tracerl.envs import commands as env_commands

    env_commands.register(app)
    from tracerl.evaluation import report_commands; report_commands.register(app)  # noqa: E702
    from tracerl.selection import commands as selection_commands; selection_commands.register(app)  # noqa: E702
    from tracerl.composition import commands as composition_commands; composition_commands.register(app)  # noqa: E702
    from tracerl.training import commands as training_commands; training_commands.register(app)  # noqa: E702
    from tracerl.synthesis import commands as synthesis_commands; synthesis_commands.register(app)  # noqa: E702


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and returns its exit code (2 and one line for bad input)."""
    _register_commands()
    try:
        code = app(args=argv, standalone_mode=False)  # click returns typer.Exit's code here
    except InputError as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        return 2
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        return 1
    except Exception as e:  # click usage errors: already one line
        import click

        if isinstance(e, click.ClickException):
            e.show()
            return 2
        raise
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def entry() -> None:
    sys.exit(main())
