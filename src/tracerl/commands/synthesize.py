"""`tracerl synthesize` (one validated, calibrated env per selected capability) and `tracerl calibrate`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

from tracerl.commands import analysis as opt
from tracerl.core.errors import InputError

MODEL_HELP = "The base agent that calibration plays: 'tiny-agent' (the shipped agent), a Hugging Face model path, or 'scripted:ACCURACY'."


def make_policy(model: str, temperature: float, seed: int) -> Any:
    """The base policy for calibration (see MODEL_HELP)."""
    if model.startswith("scripted:"):
        from tracerl.synthesis.scripted import NoisyOraclePolicy

        try:
            accuracy = float(model.split(":", 1)[1])
            return NoisyOraclePolicy(accuracy=accuracy, seed=seed)
        except ValueError as e:
            raise InputError(f"--base {model}: {e}") from None
    from tracerl.models.local import LocalPolicy, load_model

    net, tokenizer = load_model(model)
    return LocalPolicy(net, tokenizer, temperature=temperature, seed=seed, name=model)


def policy_factory(model: str, temperature: float, seed: int) -> Callable[[], Any]:
    """Fresh base policies for calibration, one per environment (each starts from `seed`); a model loads once."""
    if model.startswith("scripted:"):
        make_policy(model, temperature, seed)  # a bad accuracy fails now
        return lambda: make_policy(model, temperature, seed)
    from tracerl.models.local import LocalPolicy, load_model

    net, tokenizer = load_model(model)
    return lambda: LocalPolicy(net, tokenizer, temperature=temperature, seed=seed, name=model)


def load_bands(path: Optional[Path]):
    from pydantic import ValidationError

    from tracerl.contracts import CalibrationBands
    from tracerl.core.io import describe_validation_error, read_json

    if path is None:
        return CalibrationBands()
    try:
        return CalibrationBands.model_validate(read_json(path))
    except ValidationError as e:
        raise InputError(describe_validation_error(e), path=str(path)) from None


def _calibrate_with_progress(env_dir: Path, policy: Any, seeds: int, group_size: int, bands: Any, max_rounds: int,
                             settings: dict[str, Any]):
    from rich.progress import Progress

    from tracerl.synthesis.synthesize import calibrate_env_dir

    with Progress(transient=True) as progress:
        task = progress.add_task(f"calibrating {env_dir.name}", total=seeds * group_size * max_rounds)
        return calibrate_env_dir(env_dir, policy, seeds=seeds, group_size=group_size, bands=bands,
                                 max_rounds=max_rounds, settings=settings,
                                 on_done=lambda _t: progress.advance(task))


def synthesize(
    capabilities: Path = typer.Option(..., "--capabilities", help="capabilities.json from `tracerl select` (its "
                                      "selected ones), or your own list: YAML/JSON of {name, description} (all of them)."),
    target: str = typer.Option(..., "--target", help="An environment (`tracerl envs`, package.module:factory) or a "
                               "tools.json (`tracerl tools`)."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="The domain's policy text (markdown): its title and "
                                          "rules go in the environments' prompts and to the LLM environment writer."),
    out: Path = typer.Option(..., "--out", help="Folder for the env directories (<out>/<capability>/) and <out>/index.json."),
    generator: str = typer.Option("template", "--generator", help="'template' (built-in, LLM for the rest) or 'llm'."),
    no_calibrate: bool = typer.Option(False, "--no-calibrate", help="Skip calibration."),
    difficulty: int = typer.Option(1, "--difficulty", min=0, max=4, help="Starting difficulty (0–4)."),
    hint_fraction: float = typer.Option(0.25, "--hint-fraction", min=0.0, max=1.0,
                                        help="Share of each GRPO group sampled with the hint (written to env.json)."),
    model: str = typer.Option("tiny-agent", "--base", help=MODEL_HELP),
    seeds: int = typer.Option(100, "--seeds", min=1, help="Calibration seeds (groups)."),
    group_size: int = typer.Option(16, "--group-size", min=1, help="Samples per seed."),
    temperature: float = typer.Option(0.7, "--temperature", min=0.0, help="Sampling temperature of the base policy."),
    max_rounds: int = typer.Option(5, "--max-rounds", min=1, help="Difficulty rounds / LLM generation rounds."),
    bands: Optional[Path] = typer.Option(None, "--bands", help="JSON overriding TRACE's acceptance bands."),
    analysis_base_url: Optional[str] = opt.BASE_URL,
    analysis_model: Optional[str] = opt.MODEL,
    analysis_api_key_env: Optional[str] = opt.API_KEY_ENV,
    analysis_timeout: Optional[float] = opt.TIMEOUT,
    analysis_max_retries: Optional[int] = opt.MAX_RETRIES,
    analysis_config: Optional[Path] = opt.CONFIG,
    seed: int = typer.Option(0, "--seed", help="Sampling seed of the base policy."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON on stdout."),
) -> None:
    """One validated (and calibrated) training environment per selected capability."""
    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from tracerl.core.io import check_output, describe_validation_error
    from tracerl.synthesis.stage import SynthesizeConfig, run_synthesize
    from tracerl.synthesis.target import load_target

    try:
        config = SynthesizeConfig(generator=generator, difficulty=difficulty, hint_fraction=hint_fraction,
                                  calibrate=not no_calibrate, calibration_seeds=seeds, group_size=group_size,
                                  temperature=temperature, max_rounds=max_rounds, bands=load_bands(bands))
    except ValidationError as e:
        raise InputError(describe_validation_error(e)) from None
    from tracerl.contracts import read_capability_list

    read_capability_list(capabilities)  # a bad file fails before any model loads
    check_output(out, folder=True)
    tgt = load_target(target, policy=policy)
    llm = opt.analysis_config(analysis_config, base_url=analysis_base_url, model=analysis_model,
                              api_key_env=analysis_api_key_env, timeout=analysis_timeout,
                              max_retries=analysis_max_retries)
    if generator != "llm":  # templates first; the analysis model, where given, writes the rest
        try:
            llm.resolved()
        except InputError:
            llm = None
    policy = None if no_calibrate else policy_factory(model, temperature, seed)
    with Progress(transient=True) as progress:
        task = progress.add_task("calibrating", total=None)
        run = run_synthesize(capabilities, tgt, out, config, make_policy=policy, policy_info={"model": model, "seed": seed},
                             llm=llm, on_episode=lambda name: progress.update(task, advance=1,
                                                                               description=f"calibrating {name}"))
    index, rows = run.index, run.outcomes
    if run.analysis is not None:
        Console(stderr=True).print(f"analysis model (environment writer): {run.analysis}", highlight=False,
                                   soft_wrap=True)
    if as_json:
        typer.echo(json.dumps(index.model_dump(mode="json"), indent=2, ensure_ascii=False))
    else:
        table = Table(title=f"environments for {tgt.name}")
        table.add_column("capability", overflow="fold")
        for col in ("source", "oracle 1.0", "schema", "band", "diff.", "pass@1/16"):
            table.add_column(col, no_wrap=True)
        notes = []
        for outcome, cal in rows:
            def mark(name: str) -> str:
                found = outcome.checks.get(name) if outcome.checks else None
                return "✓" if found is not None and found.passed else "✗"

            band = "-" if cal is None else ("✓" if cal.accepted else "✗")
            p1 = "-" if cal is None else f"{cal.stats.pass_at_k['1']:.2f}"
            p16 = "-" if cal is None or "16" not in cal.stats.pass_at_k else f"{cal.stats.pass_at_k['16']:.2f}"
            table.add_row(outcome.capability, outcome.source, mark("oracle"), mark("schema"), band,
                          "-" if cal is None else str(cal.difficulty), f"{p1}/{p16}")
            note = outcome.error or (cal.stop_reason if cal is not None and not cal.accepted else "")
            if note:
                notes.append(f"{outcome.capability}: {note}")
        console = Console()
        console.print(table)
        for note in notes:
            console.print(note, highlight=False, soft_wrap=True)
    if not run.ok:
        raise typer.Exit(1)


def calibrate_command(
    env_dir: Path = typer.Argument(..., help="An env directory (envs/<capability>/)."),
    model: str = typer.Option("tiny-agent", "--base", help=MODEL_HELP),
    seeds: int = typer.Option(100, "--seeds", min=1, help="Seeds (groups)."),
    group_size: int = typer.Option(16, "--group-size", min=1, help="Samples per seed."),
    temperature: float = typer.Option(0.7, "--temperature", min=0.0, help="Sampling temperature."),
    max_rounds: int = typer.Option(5, "--max-rounds", min=1, help="Difficulty adjustment rounds."),
    bands: Optional[Path] = typer.Option(None, "--bands", help="JSON overriding TRACE's acceptance bands."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed of the policy."),
    as_json: bool = typer.Option(False, "--json", help="Print calibration.json on stdout."),
) -> None:
    """Roll the base policy out on an env (seeds × group size), check TRACE's bands, adjust difficulty."""
    from rich.console import Console
    from rich.table import Table

    from tracerl.envs.synthetic.envdir import load_env_spec

    load_env_spec(env_dir)  # bad directory → one-line error before any model is loaded
    band_config = load_bands(bands)
    policy = make_policy(model, temperature, seed)
    result = _calibrate_with_progress(env_dir, policy, seeds, group_size, band_config, max_rounds,
                                      {"temperature": temperature, "model": model, "seed": seed})
    if as_json:
        typer.echo(json.dumps(result.model_dump(mode="json"), indent=2))
        return
    table = Table(title=f"calibration of {env_dir.name}: {'accepted' if result.accepted else 'not accepted'} "
                        f"at difficulty {result.difficulty} ({result.stop_reason})")
    for col in ("difficulty", "mean", "success", "std", "all-succ", "all-zero", "constant", "informative",
                "pass@1", "pass@4", "pass@8", "pass@16", "band"):
        table.add_column(col)
    for r in result.rounds:
        s = r.stats
        pk = [f"{s.pass_at_k[k]:.2f}" if k in s.pass_at_k else "-" for k in ("1", "4", "8", "16")]
        table.add_row(str(r.difficulty), f"{s.mean_reward:.3f}", f"{s.success_rate:.3f}", f"{s.reward_std:.3f}",
                      f"{s.all_success:.2f}", f"{s.all_zero:.2f}", f"{s.constant:.2f}", f"{s.informative:.2f}", *pk,
                      "✓" if r.accepted else "✗")
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `tracerl` app."""
    app.command("synthesize")(synthesize)
    app.command("calibrate")(calibrate_command)
