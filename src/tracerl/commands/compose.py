"""`tracerl compose`: N capability adapters + base → a composed-model directory."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tracerl.core.errors import InputError


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `tracerl` app."""

    @app.command("compose")
    def compose_command(
        extra_adapters: list[str] = typer.Argument(None, metavar="[DIR]...", help="More adapter directories (so `--adapters A B C` works)."),
        adapters: list[str] = typer.Option(None, "--adapters", help="PEFT LoRA adapter directories, one per capability."),
        base: str = typer.Option(..., "--base", help="The base model the adapters were trained on (path, hub id or tiny-agent)."),
        mode: str = typer.Option("moe", "--mode", help="moe (token-level gates) | router (task-level top-1) | merge (task-level top-p weighted merge)."),
        moe_routing: str = typer.Option("opening", "--moe-routing", help="moe: opening (the gates' majority over the episode's opening routes all of it; the demo's) | token (each token routes itself)."),
        out: Path = typer.Option(..., "--out", help="The composed-model directory to write."),
        capabilities: str = typer.Option(None, "--capabilities", help="capabilities.json naming and describing the adapters' capabilities."),
        trajectories: list[str] = typer.Option(None, "--trajectories", help="Rollout JSONL files with info.capability: gate training and held-out routing accuracy."),
        target_rollouts: str = typer.Option(None, "--target-rollouts", help="moe --moe-routing opening: the base's target rollouts the selection labelled; each failed one's opening joins the gate fit, toward the capabilities its labels (labels/ beside --capabilities) found lacking."),
        heldout_fraction: float = typer.Option(0.2, help="Share of each capability's trajectories held out for routing accuracy."),
        max_steps: int = typer.Option(100, help="Gate-training steps (moe); routed at the opening, each layer's L-BFGS iterations."),
        learning_rate: float = typer.Option(1e-2, help="Gate learning rate (moe)."),
        lr_scheduler_type: str = typer.Option("linear", help="Gate learning-rate schedule: linear (to 0) | cosine | constant (moe)."),
        per_device_train_batch_size: int = typer.Option(8, help="Sequences per gate-training step (moe)."),
        router_aux_loss_coef: float = typer.Option(0.001, help="λ_LB, the load-balancing loss weight (moe)."),
        label_loss_coef: float = typer.Option(1.0, help="Weight of the label loss toward each trajectory's capability (moe)."),
        top_p: float = typer.Option(0.9, help="merge mode: labels kept until their probability reaches top_p."),
        labels: str = typer.Option(None, help="router/merge: comma-separated one-token labels, one per capability then base (default A,B,…)."),
        zero_shot: bool = typer.Option(False, "--zero-shot", help="router/merge: keep the pure zero-shot router (do not calibrate its label head on --trajectories)."),
        name: str = typer.Option(None, help="Model name the composed model is served under (default: the --out folder's name)."),
        seed: int = typer.Option(0, help="Seed of the held-out split, gate init and gate training."),
        dtype: str = typer.Option("auto", "--dtype", help="The base's precision: auto (the checkpoint's own), bfloat16, "
                                  "float16 or float32 (the adapters' training precision; recorded in composition.json)."),
        device: str = typer.Option("auto", "--device", help="Where the base runs: auto, cpu, cuda, cuda:N."),
        as_json: bool = typer.Option(False, "--json", help="Print composition.json to stdout."),
    ) -> None:
        """Compose capability adapters into one model (token-level MoE gates, or the task-level router)."""
        from pydantic import ValidationError

        from tracerl.composition.stage import (
            ComposeConfig,
            ComposeInputs,
            run_compose,
            target_lacking,
        )
        from tracerl.composition.training import GateTrainingConfig
        from tracerl.contracts import COMPOSITION_MODES
        from tracerl.core.io import check_output, describe_validation_error

        dirs = list(adapters or []) + list(extra_adapters or [])
        if not dirs:
            raise InputError("give the adapters with --adapters DIR [DIR …]")
        check_output(out, folder=True)
        if mode not in COMPOSITION_MODES:
            raise InputError(f"--mode must be one of {', '.join(COMPOSITION_MODES)}, got {mode!r}")
        try:
            gate = GateTrainingConfig(
                learning_rate=learning_rate, lr_scheduler_type=lr_scheduler_type, max_steps=max_steps,
                per_device_train_batch_size=per_device_train_batch_size,
                router_aux_loss_coef=router_aux_loss_coef, label_loss_coef=label_loss_coef, seed=seed,
                logging_steps=max(1, max_steps // 20),
            )
        except ValidationError as e:
            raise InputError(f"bad gate-training option: {describe_validation_error(e)}") from None
        try:
            config = ComposeConfig(modes=[mode], heldout_fraction=heldout_fraction, top_p=top_p, gate=gate,
                                   moe_routing=moe_routing)
        except ValidationError as e:
            raise InputError(f"bad option: {describe_validation_error(e)}") from None
        target = []
        if target_rollouts is not None:
            if mode != "moe" or moe_routing != "opening":
                raise InputError("--target-rollouts fits only the gates of --mode moe --moe-routing opening")
            if capabilities is None:
                raise InputError("--target-rollouts needs --capabilities: the selection's capabilities.json, its labels/ beside it")
            target = target_lacking(Path(target_rollouts), Path(capabilities).parent, [Path(d).name for d in dirs])
        inputs = ComposeInputs(base=base, adapters=[Path(d) for d in dirs],
                               capabilities=None if capabilities is None else Path(capabilities),
                               trajectories=[Path(t) for t in trajectories or []], target=target, dtype=dtype,
                               device=device)
        console = Console(stderr=True)
        with Progress(console=console, transient=True) as progress:
            per_layer = moe_routing == "opening"  # the gates are fitted one layer at a time
            task = progress.add_task("training gates", total=None if per_layer else max_steps,
                                     visible=mode == "moe" and bool(trajectories))

            def on_log(record: dict) -> None:
                if per_layer:
                    progress.update(task, description=f"fitted the gate of layer {record['layer']} (label loss {record['label_loss']:.3f})")
                else:
                    progress.update(task, completed=record["step"], description=f"training gates (loss {record['loss']:.3f})")

            run = run_compose(inputs, config, {mode: out}, seed=seed, names={mode: name} if name else None,
                              labels=labels.split(",") if labels else None, router_fit=not zero_shot,
                              on_gate_log=on_log)
        spec = run.specs[mode]
        if as_json:
            typer.echo(json.dumps(spec.model_dump(mode="json"), indent=2))
            return
        table = Table(title=f"composed {spec.model_name} ({spec.mode}) → {out}")
        table.add_column("slot", justify="right")
        table.add_column("capability", overflow="fold")
        table.add_column("adapter", overflow="fold")
        table.add_column("held-out routing accuracy", justify="right")
        per = spec.routing_accuracy.per_capability if spec.routing_accuracy else {}
        table.add_row("0", "base", "—", "")
        for slot, (c, a) in enumerate(zip(spec.capabilities, spec.adapters, strict=True), start=1):
            acc = per.get(c.name)
            table.add_row(str(slot), c.name, a.path, "—" if acc is None else f"{acc:.1%}")
        console.print(table)
        overall = spec.routing_accuracy.overall if spec.routing_accuracy else None
        console.print(f"gate parameters: {spec.gate_parameters:,}   routing accuracy: {'not measured (no --trajectories)' if overall is None else f'{overall:.1%}'}")
