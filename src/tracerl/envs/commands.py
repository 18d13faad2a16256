"""Environment commands: `tracerl collect` (roll a policy out and save the trajectories)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tracerl.core.errors import InputError
from tracerl.core.io import write_jsonl
from tracerl.core.trajectory import Trajectory
from tracerl.envs.airline.tasks import SPLITS, task_seeds
from tracerl.envs.registry import make_env, make_policy
from tracerl.envs.runner import Episode, rollout


def collect(
    env: Annotated[str, typer.Option(help="Environment name (built in: airline).")] = "airline",
    policy: Annotated[str, typer.Option(help="Policy spec: oracle | flawed[:p1,p2,p3,p4] | one another stage registered.")] = "oracle",
    tasks: Annotated[int, typer.Option(help="Number of tasks: the first N seeds of the split (after --offset).")] = 200,
    split: Annotated[str, typer.Option(help="Task split: train or test (fixed seed ranges; test is never trained on).")] = "test",
    seed: Annotated[int, typer.Option(help="Policy seed (fault draws, sampling).")] = 0,
    out: Annotated[Path, typer.Option(help="Where to write the rollouts (JSONL, one Trajectory per line).")] = Path("rollouts.jsonl"),
    offset: Annotated[int, typer.Option(help="Skip this many seeds of the split first.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Episodes played in lockstep.")] = 64,
    json_output: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Roll a policy out on N tasks of a split and write the trajectories (same seed ⇒ same bytes)."""
    if split not in SPLITS:
        raise InputError(f"--split must be one of {', '.join(SPLITS)}, got '{split}'")
    if tasks < 1:
        raise InputError(f"--tasks must be at least 1, got {tasks}")
    if offset < 0 or offset + tasks > len(SPLITS[split]):
        raise InputError(f"--offset {offset} + --tasks {tasks} exceeds the {len(SPLITS[split])} tasks of split '{split}'")
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    make_env(env, split=split)  # unknown env → InputError before anything runs
    agent = make_policy(policy, seed=seed)
    episodes = [Episode(seed=s) for s in task_seeds(split, tasks, offset)]
    with Progress(TextColumn("collect {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, disable=json_output) as progress:
        bar = progress.add_task(f"{env} · {agent.name}", total=len(episodes))
        trajectories = rollout(lambda: make_env(env, split=split), agent, episodes, batch_size=batch_size,
                               on_done=lambda _: progress.advance(bar))
    write_jsonl(out, trajectories)
    summary = summarise(trajectories)
    summary.update({"env": env, "policy": agent.name, "split": split, "seed": seed, "out": str(out)})
    if json_output:
        typer.echo(json.dumps(summary, indent=2))
    else:
        Console().print(summary_table(summary))


def summarise(trajectories: list[Trajectory]) -> dict[str, Any]:
    """Counts, pass rate, mean reward and turns, terminations, per task kind, planted faults (if any)."""
    n = len(trajectories)
    kinds: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        kinds.setdefault(str(t.info.get("task_kind", "-")), []).append(t)
    faults = Counter(f for t in trajectories for f in (t.info.get("faults") or {}).get("planted", []))
    return {
        "episodes": n,
        "passed": sum(t.passed for t in trajectories),
        "pass_rate": sum(t.passed for t in trajectories) / n if n else 0.0,
        "mean_reward": sum(t.reward for t in trajectories) / n if n else 0.0,
        "mean_turns": sum(t.num_turns for t in trajectories) / n if n else 0.0,
        "terminations": dict(sorted(Counter(t.termination for t in trajectories).items())),
        "by_task_kind": {k: {"episodes": len(v), "pass_rate": sum(t.passed for t in v) / len(v)} for k, v in sorted(kinds.items())},
        "planted_faults": dict(sorted(faults.items())),
    }


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"collect · {summary['env']} · {summary['policy']} · {summary['split']} → {summary['out']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("episodes", str(summary["episodes"]))
    table.add_row("pass rate", f"{summary['pass_rate']:.1%} ({summary['passed']}/{summary['episodes']})")
    table.add_row("mean reward", f"{summary['mean_reward']:.3f}")
    table.add_row("mean turns", f"{summary['mean_turns']:.1f}")
    for reason, count in summary["terminations"].items():
        table.add_row(f"termination: {reason}", str(count))
    for kind, row in summary["by_task_kind"].items():
        table.add_row(f"task kind: {kind}", f"{row['pass_rate']:.1%} of {row['episodes']}")
    for fault, count in summary["planted_faults"].items():
        table.add_row(f"planted fault: {fault}", f"{count} ({count / max(summary['episodes'], 1):.1%})")
    return table


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `tracerl` app."""
    app.command("collect")(collect)
