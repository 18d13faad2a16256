"""`tracerl build-agent`: make the embedded tiny agent (tokenizer + SFT on the flawed airline policy)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

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


def build_agent_command(
    out: Annotated[Path, typer.Option(help="Output directory (the shipped agent lives in src/tracerl/models/tiny_agent).")] = Path("tiny_agent"),
    seed: Annotated[int, typer.Option(help="Seed of the demonstrations, initialisation and batch order.")] = 0,
    policy: Annotated[str, typer.Option(help="Teacher: a flawed reference policy spec flawed:p1,p2,p3,p4 (a rate may be scoped to a request kind: 1@cancel).")] = "flawed:0.6,0.6,0.2,0.2",
    episodes: Annotated[int, typer.Option(help="Demonstration episodes (train-split seeds 0…N−1).")] = 4000,
    rule_check: Annotated[bool, typer.Option(help="The teacher says its rule check before deciding a cancellation or compensation "
                                                  "(each condition answered in turn).")] = False,
    cite_values: Annotated[bool, typer.Option(help="With --rule-check: each condition's answer follows the values it is read from "
                                                   "('business (economy) no').")] = False,
    hinted_share: Annotated[float, typer.Option(help="Share of them played with the domain's expert guidance in the system prompt, "
                                                    "which the teacher follows (never skipping the rule).")] = 0.0,
    steps: Annotated[int, typer.Option(help="Optimizer steps on episodes (every --drill-every-th a drill batch).")] = 1200,
    drill_steps: Annotated[int, typer.Option(help="Optimizer steps on id drills before the episodes (0: none).")] = 700,
    drill_target: Annotated[float, typer.Option(help="Then drill on, 50 steps at a time, until this share of the held-out id reads and of "
                                                   "the values the user answered is copied exactly (0: no check).")] = 0.95,
    drill_extra_max: Annotated[int, typer.Option(help="At most this many drill steps more.")] = 1000,
    drill_every: Annotated[int, typer.Option(help="After them, every N-th step is a drill batch (0: never).")] = 4,
    drill_episodes: Annotated[int, typer.Option(help="Conversations the drills come from: the --episodes ones, then later train seeds.")] = 4000,
    drill_max_tokens: Annotated[int, typer.Option(help="Longest id drill kept, in tokens.")] = 768,
    drill_said_words: Annotated[bool, typer.Option(help="Drill a text that says a word read as a tool result's value too "
                                                        "(a compensation check's 'silver or gold (gold) yes').")] = False,
    batch_size: Annotated[int, typer.Option(help="Episodes per step.")] = 8,
    learning_rate: Annotated[float, typer.Option(help="AdamW peak learning rate.")] = 3e-3,
    hidden_size: Annotated[int, typer.Option(help="Model width.")] = 128,
    layers: Annotated[int, typer.Option(help="Transformer layers.")] = 4,
    vocab_size: Annotated[int, typer.Option(help="Tokenizer vocabulary size (BPE merges; number tokens come on top).")] = 2048,
    number_digits: Annotated[int, typer.Option(help="Numbers cut into runs of up to this many digits, each run one token (1: every digit a token).")] = 3,
    json_keys: Annotated[bool, typer.Option(help="A JSON key with its colon one pre-token, so that a value is the token after its key's.")] = False,
    untied_embeddings: Annotated[bool, typer.Option(help="A separate output layer instead of the input embedding's transpose.")] = False,
    eval_every: Annotated[int, typer.Option(help="Validation pass every N steps (0: only at the end).")] = 0,
    test_tasks: Annotated[int, typer.Option(help="Held-out test-split tasks for the final greedy pass rate.")] = 100,
    threads: Annotated[int, typer.Option(help="torch CPU threads.")] = 2,
    device: Annotated[str, typer.Option(help="torch device to train on (e.g. cuda); the agent is saved and tested on the CPU.")] = "cpu",
    json_output: Annotated[bool, typer.Option("--json", help="Print build.json on stdout.")] = False,
) -> None:
    """Train the tokenizer and the tiny Qwen3 agent on flawed demonstrations; write model + build.json."""
    from tracerl.models.build_agent import AgentRecipe, build_agent
    from tracerl.models.tokenizer import MAX_NUMBER_DIGITS

    if not policy.startswith("flawed"):
        raise InputError(f"--policy must be a flawed reference policy spec (flawed:p1,p2,p3,p4), got '{policy}'")
    for flag, value in (("--episodes", episodes), ("--steps", steps), ("--batch-size", batch_size), ("--threads", threads),
                        ("--drill-max-tokens", drill_max_tokens)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    if not 1 <= number_digits <= MAX_NUMBER_DIGITS:
        raise InputError(f"--number-digits must be 1, 2 or 3, got {number_digits}")
    for flag, share in (("--drill-target", drill_target), ("--hinted-share", hinted_share)):
        if not 0 <= share <= 1:
            raise InputError(f"{flag} must be between 0 and 1, got {share}")
    for flag, value in (("--drill-steps", drill_steps), ("--drill-every", drill_every), ("--drill-episodes", drill_episodes),
                        ("--drill-extra-max", drill_extra_max)):
        if value < 0:
            raise InputError(f"{flag} must be 0 or more, got {value}")
    if cite_values and not rule_check:
        raise InputError("--cite-values needs --rule-check: it changes how the rule check is said")
    check_device(device)
    if hidden_size % 4:
        raise InputError(f"--hidden-size must be a multiple of 4 (4 attention heads), got {hidden_size}")
    from tracerl.core.io import check_output

    check_output(out, folder=True)
    recipe = AgentRecipe(seed=seed, policy=policy, episodes=episodes, rule_check=rule_check, cite_values=cite_values,
                         hinted_share=hinted_share,
                         max_steps=steps, batch_size=batch_size,
                         learning_rate=learning_rate, drill_steps=drill_steps, drill_every=drill_every,
                         drill_target=drill_target, drill_extra_max=drill_extra_max,
                         drill_episodes=drill_episodes, drill_max_tokens=drill_max_tokens,
                         drill_said_words=drill_said_words, hidden_size=hidden_size, num_hidden_layers=layers,
                         vocab_size=vocab_size, number_digits=number_digits, json_keys=json_keys, tie_embeddings=not untied_embeddings,
                         eval_every=eval_every, test_tasks=test_tasks, num_threads=threads,
                         warmup_steps=min(30, max(1, steps // 10)))
    command = "tracerl " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["build-agent"] else "tracerl build-agent"
    console = Console(stderr=True)
    with Progress(TextColumn("build-agent"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=json_output) as bar:
        task = bar.add_task("sft", total=steps + drill_steps, loss="-")
        report = build_agent(out, recipe, command=command, device=device, log=lambda m: console.print(m, highlight=False),
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
