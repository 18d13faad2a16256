"""What `tracerl show` reports about a rollouts file: counts, pass rate, rewards, terminations,
tool calls and a per-task-kind breakdown — as a JSON-ready dict and as rich tables."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from tracerl.core.trajectory import Trajectory


def summarize(trajectories: list[Trajectory], source: str = "") -> dict[str, Any]:
    """Summary statistics of a list of trajectories (all keys always present)."""
    n = len(trajectories)
    n_passed = sum(t.passed for t in trajectories)
    calls: Counter[str] = Counter()
    errors = 0
    checks = matched = 0
    kinds: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        for call in t.tool_calls():
            calls[call.name] += 1
        errors += sum(1 for m in t.messages if m.is_error)
        for check in t.info.get("action_checks") or []:
            checks += 1
            matched += bool(check.get("action_match"))
        kinds[str(t.info.get("task_kind", "unknown"))].append(t)
    total_calls = sum(calls.values())
    return {
        "source": source,
        "domains": sorted({t.domain for t in trajectories}),
        "count": n,
        "passed": n_passed,
        "failed": n - n_passed,
        "pass_rate": n_passed / n if n else 0.0,
        "mean_reward": sum(t.reward for t in trajectories) / n if n else 0.0,
        "mean_turns": sum(t.num_turns for t in trajectories) / n if n else 0.0,
        "terminations": dict(sorted(Counter(t.termination for t in trajectories).items())),
        "tool_calls": {
            "total": total_calls,
            "per_trajectory": total_calls / n if n else 0.0,
            "errors": errors,
            "by_tool": dict(sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))),
        },
        "action_checks": {"total": checks, "matched": matched},
        "task_kinds": {
            kind: {
                "count": len(ts),
                "passed": sum(t.passed for t in ts),
                "pass_rate": sum(t.passed for t in ts) / len(ts),
                "mean_reward": sum(t.reward for t in ts) / len(ts),
            }
            for kind, ts in sorted(kinds.items())
        },
    }


def print_summary(summary: dict[str, Any], console: Console) -> None:
    """The summary as three rich tables: overview, task kinds, tool calls."""
    overview = Table(title=f"rollouts: {summary['source']}", show_header=False)
    overview.add_column("what")
    overview.add_column("value", justify="right")
    overview.add_row("domain", ", ".join(summary["domains"]))
    overview.add_row("trajectories", str(summary["count"]))
    overview.add_row("passed", f"{summary['passed']} ({summary['pass_rate']:.1%})")
    overview.add_row("mean reward", f"{summary['mean_reward']:.3f}")
    overview.add_row("mean assistant turns", f"{summary['mean_turns']:.1f}")
    overview.add_row("terminations", ", ".join(f"{k} {v}" for k, v in summary["terminations"].items()))
    tc = summary["tool_calls"]
    overview.add_row("tool calls", f"{tc['total']} ({tc['per_trajectory']:.1f}/trajectory, {tc['errors']} errors)")
    if summary["action_checks"]["total"]:
        ac = summary["action_checks"]
        overview.add_row("action checks", f"{ac['matched']}/{ac['total']} matched")
    console.print(overview)

    kinds = Table(title="by task kind")
    for col, justify in (("task kind", "left"), ("n", "right"), ("passed", "right"), ("pass rate", "right"), ("mean reward", "right")):
        kinds.add_column(col, justify=justify)  # type: ignore[arg-type]
    for kind, row in summary["task_kinds"].items():
        kinds.add_row(kind, str(row["count"]), str(row["passed"]), f"{row['pass_rate']:.1%}", f"{row['mean_reward']:.3f}")
    console.print(kinds)

    tools = Table(title="tool calls by tool")
    tools.add_column("tool")
    tools.add_column("calls", justify="right")
    for name, count in tc["by_tool"].items():
        tools.add_row(name, str(count))
    console.print(tools)
