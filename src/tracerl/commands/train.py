"""`tracerl train`: one LoRA adapter per capability with multi-turn GRPO (or GRPO on the target env)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

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


def train_one(env: str | Path, base: str, out: Path, *, config: Path | None, force: bool, max_rollouts: int | None,
              max_steps: int | None, seed: int | None, adapter: Path | None, server: str | None,
              served_model: str | None, quiet: bool, console: Console, dtype: str | None = None,
              device: str | None = None) -> dict[str, Any]:
    """Train (or resume) one adapter into `out` with `run_train`; returns its summary."""
    from tracerl.training.config import load_config
    from tracerl.training.distributed import init_world
    from tracerl.training.stage import TrainEnv, run_train

    world = init_world()
    cfg = load_config(config, max_rollouts=max_rollouts, max_steps=max_steps, seed=seed)
    train_env = TrainEnv.resolve(env)
    show = world.is_main and not quiet
    with Progress(TextColumn(f"[bold]{train_env.name}[/]"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, disable=not show,
                  transient=False) as progress:
        task = progress.add_task("train", total=cfg.max_steps, info="")

        def on_step(row: dict[str, Any]) -> None:
            bits = [f"rollouts {row['rollouts_used']}"]
            if row.get("reward_mean") is not None:
                bits.append(f"reward {row['reward_mean']:.3f}")
            if row.get("eval_success") is not None:
                bits.append(f"eval {row['eval_success']:.3f}")
            progress.update(task, completed=row["step"], info="  ".join(bits))

        summary = run_train(train_env, base, out, cfg, force=force, world=world, init_adapter=adapter,
                            server_url=server, served_model=served_model, on_step=on_step, dtype=dtype, device=device)
    return summary.model_dump()


def run_config_model(config: Path | None) -> dict[str, Any]:
    """The `model:` section of a run config given as --config (a training config has none: {})."""
    import yaml

    if config is None or not config.is_file():
        return {}
    try:
        data = yaml.safe_load(config.read_text()) or {}
    except yaml.YAMLError:
        return {}  # load_config reports it with its line
    model = data.get("model") if isinstance(data, dict) and "train" in data else None
    return model if isinstance(model, dict) else {}


def register(app: typer.Typer) -> None:
    """Add `tracerl train` to the app."""

    @app.command("train")
    def train(
        env: str = typer.Option(..., "--env", help="environment directory (envs/<capability>/), or 'airline' "
                                                   "(GRPO on the target environment); with --all, the folder of env dirs"),
        base: str = typer.Option("tiny-agent", "--base", help="base model: a HF directory or hub name, or 'tiny-agent'"),
        out: Path = typer.Option(..., "--out", help="adapter directory to write (with --all: one subfolder per capability)"),
        config: Optional[Path] = typer.Option(None, "--config", help="YAML training config (TRL GRPOConfig / PEFT LoraConfig names)"),
        force: bool = typer.Option(False, "--force", help="start over when --out holds a run of other settings "
                                   "(without it, a run of the same settings there is resumed and one of others refused)"),
        max_rollouts: Optional[int] = typer.Option(None, "--max-rollouts", min=1, help="rollout budget (every sampled episode counts)"),
        max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1),
        seed: Optional[int] = typer.Option(None, "--seed"),
        all_: bool = typer.Option(False, "--all", help="train every capability environment under --env in turn"),
        adapter: Optional[Path] = typer.Option(None, "--adapter", help="start from this LoRA adapter instead of a fresh one"),
        server: Optional[str] = typer.Option(None, "--server", help="OpenAI-compatible vLLM server for rollouts (hot-swapped adapter)"),
        served_model: Optional[str] = typer.Option(None, "--served-adapter-name", help="the adapter's name on the server"),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="the base's precision: auto (the checkpoint's own), "
                                            "bfloat16, float16, float32 (default: a run config's model.dtype, else auto)"),
        device: Optional[str] = typer.Option(None, "--device", help="one process: auto, cpu, cuda, cuda:N (default: a "
                                             "run config's model.device, else auto); under torchrun each rank takes "
                                             "cuda:LOCAL_RANK"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as JSON on stdout"),
    ) -> None:
        """Train a LoRA adapter with multi-turn GRPO on a capability environment (or on the target)."""
        from tracerl.core.io import check_output
        from tracerl.training.config import load_config
        from tracerl.training.run import capability_dirs

        load_config(config, max_rollouts=max_rollouts, max_steps=max_steps, seed=seed)  # a bad config: before anything
        check_output(out, folder=True)
        console = Console(stderr=True)
        jobs = [(d, out / d.name) for d in capability_dirs(env)] if all_ else [(env, out)]
        model = run_config_model(config)
        dtype = dtype or model.get("dtype")
        device = device or model.get("device")
        from tracerl.training.distributed import init_world, shutdown

        try:
            summaries = [
                train_one(e, base, o, config=config, force=force, max_rollouts=max_rollouts, max_steps=max_steps,
                          seed=seed, adapter=adapter, server=server, served_model=served_model, quiet=as_json,
                          console=console, dtype=dtype, device=device)
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
            table.add_column(col, overflow="fold")
        for s in summaries:
            first, last = s["eval_success_first"], s["eval_success_last"]
            gain = "—" if first is None else f"{first:.3f} → {last:.3f} ({100 * (last - first):+.1f} pts)"
            table.add_row(s["capability"], str(s["steps"]), str(s["rollouts_used"]), gain, f"{s['seconds']:.1f}", s["out"])
        Console().print(table)
