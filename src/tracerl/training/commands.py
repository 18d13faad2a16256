"""`tracerl train`: one LoRA adapter per capability with multi-turn GRPO (or GRPO on the target env)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tracerl.core.errors import InputError


def train_one(env: str | Path, base: str, out: Path, *, config: Path | None, resume: bool, max_rollouts: int | None,
              max_steps: int | None, seed: int | None, adapter: Path | None, server: str | None,
              served_model: str | None, quiet: bool, console: Console) -> dict[str, Any]:
    """Train one adapter into `out`; returns a summary (first/last eval success, rollouts, seconds)."""
    from tracerl.training.checkpoint import latest_checkpoint
    from tracerl.training.config import load_config
    from tracerl.training.distributed import init_world
    from tracerl.training.run import build_trainer, resolve_env

    world = init_world()
    cfg = load_config(config, max_rollouts=max_rollouts, max_steps=max_steps, seed=seed)
    make_env, name, env_defaults = resolve_env(env)
    if "hint_fraction" not in cfg.model_fields_set and env_defaults.get("hint_fraction"):
        cfg = cfg.model_copy(update={"hint_fraction": float(env_defaults["hint_fraction"])})
    if resume is False and latest_checkpoint(out) is not None:  # `.checkpoint.old` too: a kill mid-swap
        raise InputError(f"{out}: holds a run already; pass --resume to continue it or choose another --out")
    show = world.is_main and not quiet
    with Progress(TextColumn(f"[bold]{name}[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=console, disable=not show, transient=False) as progress:
        task = progress.add_task("train", total=cfg.max_steps, info="")

        def on_step(row: dict[str, Any]) -> None:
            bits = [f"rollouts {row['rollouts_used']}"]
            if row.get("reward_mean") is not None:
                bits.append(f"reward {row['reward_mean']:.3f}")
            if row.get("eval_success") is not None:
                bits.append(f"eval {row['eval_success']:.3f}")
            progress.update(task, completed=row["step"], info="  ".join(bits))

        trainer = build_trainer(cfg, base, make_env, out, env_source=str(env), world=world, init_adapter=adapter,
                                server_url=server, served_model=served_model, on_step=on_step)
        rows = trainer.train(resume=resume)
    evals = [r for r in rows if r.get("eval_success") is not None]
    return {
        "capability": name, "out": str(out), "steps": rows[-1]["step"] if rows else 0,
        "rollouts_used": rows[-1]["rollouts_used"] if rows else 0,
        "eval_success_first": evals[0]["eval_success"] if evals else None,
        "eval_success_last": evals[-1]["eval_success"] if evals else None,
        "seconds": round(sum(r.get("seconds", 0.0) or 0.0 for r in rows), 2),
        "world_size": world.size, "rank": world.rank,
    }


def register(app: typer.Typer) -> None:
    """Add `tracerl train` to the app."""

    @app.command("train")
    def train(
        env: str = typer.Option(..., "--env", help="environment directory (envs/<capability>/), or 'airline' "
                                                   "(GRPO on the target environment); with --all, the folder of env dirs"),
        base: str = typer.Option("tiny-agent", "--base", help="base model: a HF directory or hub name, or 'tiny-agent'"),
        out: Path = typer.Option(..., "--out", help="adapter directory to write (with --all: one subfolder per capability)"),
        config: Optional[Path] = typer.Option(None, "--config", help="YAML training config (TRL GRPOConfig / PEFT LoraConfig names)"),
        resume: bool = typer.Option(False, "--resume", help="continue the run in --out from its last checkpoint"),
        max_rollouts: Optional[int] = typer.Option(None, "--max-rollouts", min=1, help="rollout budget (every sampled episode counts)"),
        max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1),
        seed: Optional[int] = typer.Option(None, "--seed"),
        all_: bool = typer.Option(False, "--all", help="train every capability environment under --env in turn"),
        adapter: Optional[Path] = typer.Option(None, "--adapter", help="start from this LoRA adapter instead of a fresh one"),
        server: Optional[str] = typer.Option(None, "--server", help="OpenAI-compatible vLLM server for rollouts (hot-swapped adapter)"),
        served_model: Optional[str] = typer.Option(None, "--served-adapter-name", help="the adapter's name on the server"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as JSON on stdout"),
    ) -> None:
        """Train a LoRA adapter with multi-turn GRPO on a capability environment (or on the target)."""
        from tracerl.training.run import capability_dirs

        console = Console(stderr=True)
        jobs = [(d, out / d.name) for d in capability_dirs(env)] if all_ else [(env, out)]
        from tracerl.training.distributed import init_world, shutdown

        try:
            summaries = [
                train_one(e, base, o, config=config, resume=resume, max_rollouts=max_rollouts, max_steps=max_steps,
                          seed=seed, adapter=adapter, server=server, served_model=served_model, quiet=as_json,
                          console=console)
                for e, o in jobs
            ]
        finally:
            shutdown(init_world())
        if summaries and summaries[0]["rank"] != 0:
            return
        if as_json:
            typer.echo(json.dumps(summaries if all_ else summaries[0], indent=2))
            return
        table = Table(title="GRPO adapters")
        for col in ("capability", "steps", "rollouts", "eval success (step 0 → last)", "seconds", "adapter"):
            table.add_column(col)
        for s in summaries:
            first, last = s["eval_success_first"], s["eval_success_last"]
            gain = "—" if first is None else f"{first:.3f} → {last:.3f} ({100 * (last - first):+.1f} pts)"
            table.add_row(s["capability"], str(s["steps"]), str(s["rollouts_used"]), gain, f"{s['seconds']:.1f}", s["out"])
        Console().print(table)
