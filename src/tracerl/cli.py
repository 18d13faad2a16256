"""The `tracerl` command. Each stage module adds its commands here; bad input exits with code 2."""

from __future__ import annotations

import os
import sys
import warnings

import typer
from rich.console import Console
from rich.markup import escape

from tracerl import __version__
from tracerl.core.errors import InputError

try:  # typer ≥ 0.16 vendors click; its exceptions are not click's
    from typer._click.exceptions import ClickException as _ClickException
except ImportError:  # pragma: no cover
    from click import ClickException as _ClickException

app = typer.Typer(
    name="tracerl",
    help="TRACE: find the capabilities an agent lacks, train one LoRA adapter per capability, compose them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)
# The libraries' own deprecation notices are for tracerl's developers (the tests show them), not its users.
LIBRARY_WARNINGS = r"(transformers|peft|torch|accelerate)(\.|$)"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tracerl {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")) -> None:
    """TRACE: find the capabilities an agent lacks, train one LoRA adapter per capability, compose them."""


@app.callback()
def _options(
    allow_unconfined_generated_code: bool = typer.Option(
        False, "--allow-unconfined-generated-code",
        help="Run LLM-written environment code even where the kernel cannot confine it (no Landlock or seccomp): "
             "it then has your user's access to files and network."),
) -> None:
    if allow_unconfined_generated_code:
        from tracerl.envs.synthetic.sandbox import ALLOW_UNCONFINED

        os.environ[ALLOW_UNCONFINED] = "1"


_COMMAND_MODULES = (
    "tracerl.commands.collect",  # collect, show
    "tracerl.commands.select",  # select
    "tracerl.commands.synthesize",  # synthesize, calibrate
    "tracerl.commands.train",  # train
    "tracerl.commands.compose",  # compose
    "tracerl.commands.report",  # report
    "tracerl.commands.build_agent",  # build-agent
    "tracerl.commands.serve",  # serve
    "tracerl.commands.run",  # run, demo, eval
    "tracerl.commands.envs",  # envs, tools
    "tracerl.commands.import_model",  # import-model
)
_registered = False


def _register_commands() -> None:
    """Each module adds its commands with `register(app)`; imported here, once, to keep start-up light."""
    global _registered
    if _registered:
        return
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(app)
    _registered = True


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and returns its exit code (2 and one line for bad input)."""
    _register_commands()
    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category, module=LIBRARY_WARNINGS)
    try:
        code = app(args=argv, standalone_mode=False)  # click returns typer.Exit's code here
    except InputError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        return 2
    except OSError as e:  # a file the user named that cannot be read or written (checked ones are InputErrors)
        if e.filename is None:
            raise
        where = f"{e.filename} → {e.filename2}" if e.filename2 else str(e.filename)
        console.print(f"[bold red]error:[/] {escape(where)}: {escape(e.strerror or type(e).__name__)}", highlight=False,
                      soft_wrap=True)
        return 2
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        return 1
    except _ClickException as e:  # usage errors (bad flag, bad value): click prints one line
        e.show()
        return 2
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
