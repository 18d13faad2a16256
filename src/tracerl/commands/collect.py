"""Environment commands: `tracerl collect` (roll a policy out), `tracerl show` (summarise rollouts) and
`tracerl predictions` (a run's patches as SWE-bench predictions)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from tracerl.core.errors import InputError


def collect(
    env: Annotated[str, typer.Option(help="Environment: a name (`tracerl envs` lists them), package.module:factory, tau2:<domain> (τ²-bench played live; needs --tau2) or toolsandbox (ToolSandBox's offline scenarios played live; needs --toolsandbox).")] = "airline",
    policy: Annotated[str, typer.Option(help="Policy spec: model[:PATH] | remote:URL[#MODEL] | a reference policy of the environment (airline: oracle, flawed[:p1,p2,p3,p4]; toolsandbox: milestone-replay).")] = "oracle",
    tasks: Annotated[int, typer.Option(help="Number of tasks: the first N of the split (after --offset).")] = 200,
    split: Annotated[str, typer.Option(help="Task split: train or test (test is never trained on).")] = "test",
    seed: Annotated[int, typer.Option(help="Policy seed (fault draws, sampling).")] = 0,
    out: Annotated[Path, typer.Option(help="Where to write the rollouts (JSONL, one Trajectory per line).")] = Path("rollouts.jsonl"),
    offset: Annotated[int, typer.Option(help="Skip this many tasks of the split first.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Episodes played at once.")] = 64,
    tau2: Annotated[Optional[Path], typer.Option("--tau2", help="τ²-bench settings (YAML: user simulator, judge, reward basis) for a tau2:<domain> env.")] = None,
    tau2_results: Annotated[Optional[Path], typer.Option("--tau2-results", help="Also write τ²-bench's results file of the episodes (tau2:<domain> only).")] = None,
    toolsandbox: Annotated[Optional[Path], typer.Option("--toolsandbox", help="ToolSandBox settings (YAML: user simulator, splits) for the toolsandbox env.")] = None,
    toolsandbox_results: Annotated[Optional[Path], typer.Option("--toolsandbox-results", help="Also write the episodes as a ToolSandBox run folder (toolsandbox only).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Roll a policy out on N tasks of a split and write the trajectories (same seed ⇒ same bytes)."""
    from tracerl.core.sampling import RolloutSettings
    from tracerl.envs.collect import CollectConfig, run_collect, target_factory
    from tracerl.envs.summary import print_summary, summarize
    from tracerl.models.factory import make_policy

    from tracerl.core.io import check_output

    if tasks < 1:
        raise InputError(f"--tasks must be at least 1, got {tasks}")
    check_output(out, folder=False)
    if tau2_results is not None:
        check_output(tau2_results, folder=False, what="--tau2-results")
    if toolsandbox_results is not None:
        check_output(toolsandbox_results, folder=True, what="--toolsandbox-results")
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    live = env.startswith("tau2:")
    if (tau2 is not None or tau2_results is not None) and not live:
        raise InputError(f"--tau2 and --tau2-results are for a tau2:<domain> env, not '{env}'")
    settings: dict[str, Any] = {}
    if live:
        if tau2 is None:
            raise InputError(f"--env {env} needs --tau2 SETTINGS.yaml (the user simulator's endpoint, at least)")
        from tracerl.envs.tau2_live import load_tau2_settings

        settings = load_tau2_settings(tau2)
    if (toolsandbox is not None or toolsandbox_results is not None) and env != "toolsandbox":
        raise InputError(f"--toolsandbox and --toolsandbox-results are for the toolsandbox env, not '{env}'")
    if env == "toolsandbox":
        if toolsandbox is None:
            raise InputError("--env toolsandbox needs --toolsandbox SETTINGS.yaml (the user simulator's endpoint, at least)")
        settings = {"settings": toolsandbox}
    with Progress(TextColumn("collect {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, disable=json_output) as progress:
        bar = progress.add_task(f"{env} · {policy}", total=tasks)
        make_env = target_factory(env, split, settings)
        collected = run_collect(make_env, lambda: make_policy(policy, seed=seed, make_env=make_env),
                                CollectConfig(tasks=tasks), out, split=split, offset=offset,
                                rollout_settings=RolloutSettings(batch_size=batch_size),
                                tau2_results=tau2_results, native_results=toolsandbox_results,
                                on_done=lambda _: progress.advance(bar))
    trajectories, name = collected.trajectories, collected.policy
    summary = summarize(trajectories, source=str(out))
    faults = Counter(f for t in trajectories for f in (t.info.get("faults") or {}).get("planted", []))
    summary.update({"env": env, "policy": name, "split": split, "seed": seed,
                    "planted_faults": dict(sorted(faults.items()))})
    if json_output:
        typer.echo(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        console = Console()
        console.print(f"collect: {env} · {name} · split {split} · seed {seed} → {out}", highlight=False)
        print_summary(summary, console)
        print_faults(summary, console)


def print_faults(summary: dict[str, Any], console: Console) -> None:
    """Planted faults of a flawed reference policy (the known failure composition), when there are any."""
    if not summary["planted_faults"]:
        return
    table = Table(title="planted faults (flawed policy)")
    table.add_column("fault")
    table.add_column("episodes", justify="right")
    table.add_column("share", justify="right")
    for fault, count in summary["planted_faults"].items():
        table.add_row(fault, str(count), f"{count / max(summary['count'], 1):.1%}")
    console.print(table)


def show(
    file: Path = typer.Argument(..., help="Rollouts: our JSONL, a τ²-bench results JSON or a ToolSandBox run folder."),
    tools: Optional[Path] = typer.Option(None, "--tools", help="A tools.json (τ²-bench style) for files without tool schemas."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
) -> None:
    """Summarise a rollouts file: count, pass rate, rewards, terminations, tool calls, task kinds."""
    from tracerl.envs.loading import load_rollouts
    from tracerl.envs.summary import print_summary, summarize

    summary = summarize(load_rollouts(file, tools=tools), source=str(file))
    if as_json:
        typer.echo(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        print_summary(summary, Console())


def predictions(
    rollouts: Path = typer.Argument(..., help="Rollouts of the code domain (JSONL, e.g. a run's eval/<variant>.jsonl) "
                                    "or a folder of SWE-bench agent trajectories with their reports."),
    out: Path = typer.Option(Path("predictions.jsonl"), "--out", help="Where to write SWE-bench's predictions JSONL."),
    model: str = typer.Option("tracerl", "--model", help="model_name_or_path of every prediction."),
) -> None:
    """Write a run's patches as SWE-bench predictions (instance_id, model_name_or_path, model_patch), the
    input of `python -m swebench.harness.run_evaluation --predictions_path OUT`."""
    from tracerl.envs.loading import load_rollouts
    from tracerl.envs.swebench import write_predictions

    count = write_predictions(load_rollouts(rollouts), out, model)
    if count == 0:
        raise InputError("no rollout carries an instance_id and a model_patch (code-domain or SWE-bench rollouts)",
                         path=str(rollouts))
    Console().print(f"predictions: {count} → {out}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `tracerl` app."""
    app.command("collect")(collect)
    app.command("show")(show)
    app.command("predictions")(predictions)
