"""`tracerl run`: the whole TRACE loop as resumable stages in one workspace folder.

    collect → select → synthesize (+calibrate) → train:<capability>… → compose → grpo_target → curve
    → eval:<variant>… → report

Each stage reads only earlier stages' files, writes its own atomically and is skipped when its
outputs exist and its inputs and config are unchanged (`tracerl.stages`). A stage function is
given only the config sections it reads (`SECTIONS`, a `View`), and its cache key is every field
of them. Training resumes from its last checkpoint, so killing a run anywhere and starting it
again loses at most one step. An environment that calibration rejected stops the run before it
is trained, unless the config says `train_rejected: true` (or `informative`: not one whose
calibration groups all had equal rewards, where GRPO gets no gradient).

Workspace layout:
    config.yaml                      the resolved run config
    rollouts/base.jsonl              base-agent rollouts on the target's train split
    capabilities.json, labels/       step 1
    envs/<capability>/               step 2 (env.json, calibration.json)
    adapters/<capability>/           step 3 (PEFT adapter, metrics.jsonl, checkpoints, snapshots/step_<n>/)
    gate_data/<capability>.jsonl     adapter rollouts that train the gates
    composed/, composed_router/      step 4 (composition.json, gates.safetensors)
    baselines/grpo_target/           GRPO on the target with TRACE's rollout budget
    curve/                           TRACE at the adapters' earlier evaluation steps, on GRPO's held-out episodes
                                     (curve.json; step_<n>/: the composition of step n's snapshots; step_<n>.jsonl)
    eval/<variant>.json|.jsonl       held-out evaluation
    eval/tau2/<variant>.json         the same episodes as τ²-bench's results file (a tau2:<domain> target)
    report/index.html, report.json   the report
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from rich.console import Console

from tracerl.config import RunConfig, train_config
from tracerl.contracts import (
    TRACE_VARIANTS, CalibrationResult, CapabilitiesFile, CapabilityResult, EnvIndex, EvalResult, GateData, eval_file_stem,
    read_metrics,
)
from tracerl.core.errors import InputError
from tracerl.core.io import atomic_write_text, read_jsonl, write_jsonl
from tracerl.core.trajectory import Trajectory
from tracerl.evaluation.stage import EvalVariant
from tracerl.stages import Stage, View, is_complete, run_stage

STAGES = ("collect", "select", "synthesize", "train", "compose", "grpo_target", "curve", "eval", "report")
COMPOSED_DIRS = {"moe": "composed", "router": "composed_router", "merge": "composed_merge"}
# The RunConfig sections each stage reads: its function gets only these, its key is all of them.
SECTIONS = {
    "collect": ["seed", "model", "rollout", "target", "collect"],
    "select": ["seed", "select", "analysis"],
    "synthesize": ["seed", "model", "rollout", "target", "synthesize", "analysis"],
    "train": ["seed", "model", "rollout", "train"],
    "compose": ["seed", "model", "rollout", "compose", "train_rejected"],  # train_rejected: which adapters exist
    "grpo_target": ["seed", "model", "rollout", "target", "train", "train_rejected"],
    "curve": ["seed", "rollout", "target", "train", "compose", "train_rejected"],
    "eval": ["seed", "model", "rollout", "target", "eval", "train_rejected"],
    "report": [],  # it reads the workspace, config.yaml included
}


class Pipeline:
    """The stage graph over one workspace: which stages exist, what each reads and writes, and in what order."""

    def __init__(self, config: RunConfig, workspace: str | Path, *, console: Console | None = None,
                 eval_server: str | None = None):
        self.cfg = config
        self.eval_server = eval_server  # `tracerl eval --server`: the eval stages' model.server_url
        self.ws = Path(workspace)
        self.stage_fns = StageFunctions(self.ws, console or Console(stderr=True))
        self.log: list[dict[str, Any]] = []

    def path(self, rel: str) -> Path:
        return self.ws / rel

    def trained_envs(self) -> list[str]:
        return self.stage_fns.trained_envs(self.cfg.train_rejected)

    # --- the stage graph ---------------------------------------------------------------------------
    def stage(self, name: str, inputs: list[str], outputs: list[str], *args: Any) -> Stage:
        """Stage `name` (kind[:item]): its function called with its `View` of the config (and `args`)."""
        kind = name.split(":")[0]
        view = View(self.cfg, SECTIONS[kind])
        if kind == "eval" and self.eval_server:
            view.model = view.model.model_copy(update={"server_url": self.eval_server})
        fn = getattr(self.stage_fns, "evaluate" if kind == "eval" else kind)
        return Stage(name, lambda: fn(view, *args), inputs=inputs, outputs=outputs, config=view.key())

    def stages(self) -> list[Stage]:
        """The stages runnable now (later stages depend on what earlier ones wrote)."""
        cfg = self.cfg
        target_files = [p for p in (cfg.target.results, cfg.target.tools, cfg.target.tau2) if p is not None]
        caps = self.trained_envs()
        live_tools = cfg.target.env.startswith("tau2:") and cfg.target.tools is None  # read off the live target
        out: list[Stage] = [
            self.stage("collect", target_files, ["rollouts/base.jsonl"]),
            self.stage("select", ["rollouts/base.jsonl"] + ([cfg.select.capabilities] if cfg.select.capabilities else []),
                       ["capabilities.json"]),
            self.stage("synthesize", ["capabilities.json"] + target_files + (["rollouts/base.jsonl"] if live_tools else []),
                       ["envs/index.json"] + [f"envs/{c}" for c in caps]),
        ]
        if cfg.target.results is not None:
            return out  # an imported target: selection and synthesis only (no simulator to train or evaluate on)
        for cap in caps:
            out.append(self.stage(f"train:{cap}", [f"envs/{cap}"], [f"adapters/{cap}/adapter_model.safetensors",
                                                                     f"adapters/{cap}/metrics.jsonl"], cap))
        adapters = [f"adapters/{c}/adapter_model.safetensors" for c in caps]
        out.append(self.stage("compose", adapters + [f"envs/{c}" for c in caps]
                              + ["capabilities.json", "rollouts/base.jsonl", "labels"],
                              [f"{COMPOSED_DIRS[m]}/composition.json" for m in cfg.compose.modes]
                              + ["gate_data/summary.json"]))
        if cfg.baselines.grpo_target:
            out.append(self.stage("grpo_target", adapters + ["gate_data/summary.json"] + target_files,
                                  ["baselines/grpo_target/adapter_model.safetensors",
                                   "baselines/grpo_target/metrics.jsonl"]))
        if cfg.compose.modes:
            mode = trace_mode(cfg.compose.modes)
            out.append(self.stage("curve", [COMPOSED_DIRS[mode], "gate_data/summary.json"] + target_files
                                  + [f"adapters/{c}/{f}" for c in caps for f in ("metrics.jsonl", "snapshots")],
                                  ["curve/curve.json"]))
        for variant, inputs in self.variants().items():
            out.append(self.stage(f"eval:{variant}", inputs + target_files, [f"eval/{eval_file_stem(variant)}.json"],
                                  variant))
        metrics = [f"adapters/{c}/metrics.jsonl" for c in caps] + ["baselines/grpo_target/metrics.jsonl"]
        out.append(self.stage("report", ["config.yaml", "rollouts/base.jsonl", "capabilities.json", "envs", "eval",
                                         "gate_data/summary.json", "curve/curve.json"] + metrics
                              + [f"{COMPOSED_DIRS[m]}/composition.json" for m in cfg.compose.modes],
                              ["report/index.html", "report/report.json"]))
        return out

    def variants(self) -> dict[str, list[str]]:
        """Evaluated variants → the files their result depends on. `base` comes first (the others
        are compared with it)."""
        cfg, caps = self.cfg, self.trained_envs()
        variants: dict[str, list[str]] = {"base": []}
        for mode in cfg.compose.modes:
            variants[TRACE_VARIANTS[mode]] = [f"{COMPOSED_DIRS[mode]}", "eval/base.json"]
        if cfg.baselines.grpo_target:
            variants["grpo_target"] = ["baselines/grpo_target/adapter_model.safetensors", "eval/base.json"]
        if cfg.baselines.prompt_capabilities:
            variants["prompt_capabilities"] = ["capabilities.json", "eval/base.json"]
        if cfg.baselines.single_adapters:
            for cap in caps:
                variants[f"adapter:{cap}"] = [f"adapters/{cap}/adapter_model.safetensors", "eval/base.json"]
        return variants

    def run(self, *, force: set[str] = frozenset(), only: set[str] | None = None,
            on_stage: Callable[[str, bool, dict], None] | None = None) -> None:
        """Run every stage that is not complete (and those in `force`). With `only`, the other
        stages must already be complete (e.g. `tracerl eval` on a trained workspace)."""
        unknown = {f.split(":")[0] for f in set(force) | set(only or ())} - set(STAGES)
        if unknown:
            raise InputError(f"unknown stage {sorted(unknown)[0]!r} (stages: {', '.join(STAGES)})")
        self.ws.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path("config.yaml"), self.cfg.to_yaml())
        done: set[str] = set()
        while True:
            pending = [s for s in self.stages() if s.name not in done]
            if not pending:
                return
            stage = pending[0]
            kind = stage.name.split(":")[0]
            if kind == "train" and not self.cfg.train_rejected:
                self.refuse_if_rejected(stage.name.split(":", 1)[1])
            if only is not None and kind not in only and not is_complete(self.ws, stage):
                raise InputError(f"stage '{stage.name}' has not run (or its inputs changed): run `tracerl run` first",
                                 path=str(self.ws))
            forced = stage.name in force or kind in force
            # A training run left in the stage's folder is resumed when the stage never finished (killed);
            # one the stage finished before, with other inputs or config, is replaced, as any stage's outputs are.
            self.stage_fns.forcing = forced or (self.path(f".stages/{stage.name}.json").exists()
                                                and not is_complete(self.ws, stage))
            ran, summary = run_stage(self.ws, stage, force=forced)
            done.add(stage.name)
            self.log.append({"stage": stage.name, "ran": ran, "summary": summary})
            if on_stage is not None:
                on_stage(stage.name, ran, summary)

    def refuse_if_rejected(self, capability: str) -> None:
        """Stop (exit 2) before training on an environment calibration rejected, naming its figures."""
        path = self.path(f"envs/{capability}/calibration.json")
        if not path.exists():
            return  # not calibrated (synthesize.calibrate: false): nothing rejected it
        result = CalibrationResult.read(path)
        if result.accepted:
            return
        final = next((r for r in reversed(result.rounds) if r.difficulty == result.difficulty), None)
        reasons = "; ".join(final.reasons) if final is not None else f"success rate {result.stats.success_rate:.3f}"
        raise InputError(f"calibration rejected environment '{capability}' at difficulty {result.difficulty} "
                         f"({reasons}); set train_rejected: true in the config to train it anyway", path=str(path))


class StageFunctions:
    """The stages' work over one workspace. Each is given its `View` of the config and nothing more
    (this class holds no config), so what a stage reads is what its cache key covers."""

    def __init__(self, workspace: Path, console: Console):
        self.ws = workspace
        self.console = console
        self.forcing = False  # training starts over, not resuming (`Pipeline.run` says when)

    # --- shared helpers -------------------------------------------------------------------------
    def path(self, rel: str) -> Path:
        return self.ws / rel

    @staticmethod
    def target_env(c: View, split: str) -> Callable[[], Any]:
        from tracerl.envs.collect import target_factory

        if c.target.env.startswith("tau2:") and c.target.tau2 is not None:
            from tracerl.envs.tau2_live import load_tau2_settings

            return target_factory(c.target.env, split, load_tau2_settings(c.target.tau2))
        return target_factory(c.target.env, split)

    @staticmethod
    def policy(c: View, *, temperature: float, seed: int, adapters: dict[str, Path] | None = None):
        """A local policy over a fresh copy of the base model (adapters mutate the model they load into)."""
        from tracerl.models.local import LocalPolicy, load_model

        model, tokenizer = load_model(c.model.base)
        policy = LocalPolicy(model, tokenizer, temperature=temperature, seed=seed,
                             max_new_tokens=c.rollout.max_new_tokens, max_batch_size=c.rollout.batch_size)
        for name, path in (adapters or {}).items():
            policy.load_adapter(name, path)
        return policy

    def selected(self) -> list[CapabilityResult]:
        return CapabilitiesFile.read(self.path("capabilities.json")).selected()

    def trained_envs(self, train_rejected: bool | str) -> list[str]:
        """The environments adapters are trained on under the config's `train_rejected`, in selection order."""
        index = self.path("envs/index.json")
        return EnvIndex.read(index).trainable(train_rejected == "informative") if index.exists() else []

    def trace_rollouts(self, c: View) -> int:
        """Rollouts TRACE consumed: every adapter's GRPO rollouts plus the gate-training rollouts."""
        total = 0
        for cap in self.trained_envs(c.train_rejected):
            rows = read_metrics(self.path(f"adapters/{cap}/metrics.jsonl"))
            total += rows[-1].rollouts_used if rows else 0
        gate = self.path("gate_data/summary.json")
        return total + (GateData.read(gate).rollouts if gate.exists() else 0)

    # --- stages ---------------------------------------------------------------------------------
    def collect(self, c: View) -> dict[str, Any]:
        if c.target.results is not None:
            from tracerl.envs.loading import load_rollouts

            trajectories = load_rollouts(c.target.results, tools=c.target.tools)
            write_jsonl(self.path("rollouts/base.jsonl"), trajectories)
        else:
            from tracerl.envs.collect import run_collect

            with _progress(self.console, "collect", c.collect.tasks) as bar:
                trajectories = run_collect(self.target_env(c, "train"),
                                           lambda: self.policy(c, temperature=c.collect.temperature, seed=c.seed),
                                           c.collect, self.path("rollouts/base.jsonl"), split="train",
                                           batch_size=c.rollout.batch_size, on_done=bar.advance).trajectories
        passed = sum(t.passed for t in trajectories)
        return {"trajectories": len(trajectories), "passed": passed, "pass_rate": passed / max(1, len(trajectories))}

    def select(self, c: View) -> dict[str, Any]:
        from tracerl.selection.stage import progress_steps, run_select

        trajectories = read_jsonl(self.path("rollouts/base.jsonl"), Trajectory)
        with _progress(self.console, f"select ({c.select.labeler})", progress_steps(c.select, len(trajectories))) as bar:
            result = run_select(trajectories, c.select, seed=c.seed, out_dir=self.ws, llm=_llm_config(c),
                                on_step=bar.advance)
        return {"selected": [x.name for x in result.document.selected()]}

    def synthesize(self, c: View) -> dict[str, Any]:
        from tracerl.synthesis.stage import run_synthesize
        from tracerl.synthesis.target import load_target

        cfg = c.synthesize
        if c.target.env.startswith("tau2:") and c.target.tools is None:  # the live domain states its own tools
            from tracerl.synthesis.target import target_from_live_env

            played = read_jsonl(self.path("rollouts/base.jsonl"), Trajectory)
            target = target_from_live_env(self.target_env(c, "train")(), played)
        else:
            target = load_target(c.target.tools or c.target.env)
        llm = None
        if cfg.generator == "llm":
            from openai import OpenAI

            a = c.analysis
            llm = (OpenAI(base_url=a.base_url, api_key=os.environ.get(a.api_key_env, "EMPTY")), a.model)

        def no_env(outcome: Any) -> None:
            if not outcome.ok:
                self.console.print(f"[yellow]{outcome.capability}: no environment ({outcome.error})[/]")

        with _progress(self.console, "calibrate (episodes, all capabilities and rounds)", None) as bar:
            run = run_synthesize(self.path("capabilities.json"), target, self.path("envs"), cfg,
                                 make_policy=lambda: self.policy(c, temperature=cfg.temperature, seed=c.seed),
                                 policy_info={"model": c.model.base, "max_new_tokens": c.rollout.max_new_tokens},
                                 llm=llm, on_episode=bar.advance, on_outcome=no_env)
        return {"environments": run.index.built()}

    def train(self, c: View, capability: str) -> dict[str, Any]:
        from tracerl.training.stage import TrainEnv

        env = TrainEnv.resolve(self.path(f"envs/{capability}"))
        env.source = f"envs/{capability}"  # workspace-relative: a moved workspace resumes its runs
        return self._train_adapter(c, env, self.path(f"adapters/{capability}"), label=capability)

    def _train_adapter(self, c: View, env: Any, out: Path, *, label: str,
                       max_rollouts: int | None = None) -> dict[str, Any]:
        """`run_train` on `env` (a `TrainEnv`) into `out`, with this stage's config."""
        from tracerl.training.stage import run_train

        cfg = train_config(c.train, c.rollout, c.seed)
        if max_rollouts is not None:
            cfg = cfg.model_copy(update={"max_rollouts": max_rollouts, "max_steps": max(cfg.max_steps, 10_000)})
        unit = "steps" if max_rollouts is None else "rollouts"
        with _progress(self.console, f"train {label} ({unit})", cfg.max_steps if max_rollouts is None else max_rollouts) as bar:
            def on_step(row: dict[str, Any]) -> None:
                bar.update(row["step"] if max_rollouts is None else row["rollouts_used"])

            summary = run_train(env, c.model.base, out, cfg, force=self.forcing, server_url=c.model.server_url,
                                on_step=on_step)
        return summary.model_dump(include={"rollouts_used", "eval_success_first", "eval_success_last", "resumed"})

    def compose(self, c: View) -> dict[str, Any]:
        from tracerl.composition.stage import ComposeInputs, fits_target_openings, run_compose, summary, target_lacking

        caps = self.trained_envs(c.train_rejected)
        selected = {cap.name: cap.definition() for cap in self.selected()}
        inputs = ComposeInputs(base=c.model.base, adapters=[self.path(f"adapters/{cap}") for cap in caps],
                               capabilities=[selected[cap] for cap in caps],  # those trained (`trained_envs`)
                               envs={cap: self.path(f"envs/{cap}") for cap in caps},
                               target=target_lacking(self.path("rollouts/base.jsonl"), self.path("."), caps)
                               if fits_target_openings(c.compose) else [])
        run = run_compose(inputs, c.compose, {m: self.path(COMPOSED_DIRS[m]) for m in c.compose.modes}, seed=c.seed,
                          names=TRACE_VARIANTS, gate_dir=self.path("gate_data"), batch_size=c.rollout.batch_size,
                          make_policy=lambda: self.policy(c, temperature=c.rollout.temperature, seed=c.seed + 1,
                                                          adapters=dict(zip(caps, inputs.adapters))))
        return summary(run)

    def grpo_target(self, c: View) -> dict[str, Any]:
        from tracerl.training.stage import TrainEnv

        env = TrainEnv(self.target_env(c, "train"), source=c.target.env, name=c.target.env,
                       make_eval=self.target_env(c, "test"))
        return self._train_adapter(c, env, self.path("baselines/grpo_target"), label="grpo_target",
                                   max_rollouts=self.trace_rollouts(c))

    def curve(self, c: View) -> dict[str, Any]:
        from tracerl.evaluation.curve import CurveInputs, run_curve

        mode = trace_mode(c.compose.modes)
        gate = self.path("gate_data/summary.json")
        inputs = CurveInputs(variant=TRACE_VARIANTS[mode], composed=self.path(COMPOSED_DIRS[mode]),
                             adapters={cap: self.path(f"adapters/{cap}") for cap in self.trained_envs(c.train_rejected)},
                             gate_rollouts=GateData.read(gate).rollouts if gate.exists() else 0)
        with _progress(self.console, f"curve {inputs.variant} (episodes)", None) as bar:
            curve = run_curve(inputs, train_config(c.train, c.rollout, c.seed), self.target_env(c, "test"), self.path("curve"),
                              on_done=bar.advance)
        return {"points": [[p.rollouts, p.success] for p in curve.points], "note": curve.note}

    def evaluate(self, c: View, variant: str) -> dict[str, Any]:
        from tracerl.evaluation.stage import run_evaluate

        played = self.eval_variant(c, variant)
        if played.composed is not None and c.model.server_url:
            from tracerl.evaluation.served import LOCAL_NOTE

            self.console.print(f"[yellow]{LOCAL_NOTE.format(variant=variant, url=c.model.server_url)}[/]", highlight=False)
        make_env = self.target_env(c, "test")
        base_path = self.path("eval/base.json")
        with _progress(self.console, f"eval {variant}", c.eval.tasks * c.eval.trials) as bar:
            result = run_evaluate(played, make_env, c.eval, self.path("eval"), seed=c.seed, rollout=c.rollout,
                                  make_policy=lambda temperature, adapters: self._eval_policy(c, make_env, temperature,
                                                                                              adapters),
                                  capabilities=[x.name for x in self.selected()],
                                  base=EvalResult.read(base_path) if variant != "base" and base_path.exists() else None,
                                  tau2_results=c.target.env.startswith("tau2:"), on_done=bar.advance)
        return {"pass1": result.pass1.mean, "rollouts_used": played.rollouts_used}

    def eval_variant(self, c: View, variant: str) -> EvalVariant:
        """What plays as `variant` in this workspace, and the rollouts its training consumed."""
        if variant.startswith("trace_"):
            mode = next(m for m, v in TRACE_VARIANTS.items() if v == variant)
            return EvalVariant(variant, composed=self.path(COMPOSED_DIRS[mode]), rollouts_used=self.trace_rollouts(c))
        if variant == "grpo_target" or variant.startswith("adapter:"):
            name = variant.split(":", 1)[-1]
            folder = self.path("baselines/grpo_target" if variant == "grpo_target" else f"adapters/{name}")
            return EvalVariant(variant, adapters={name: folder},
                               rollouts_used=read_metrics(folder / "metrics.jsonl")[-1].rollouts_used)
        if variant == "prompt_capabilities":
            from tracerl.evaluation.evaluate import capability_note

            return EvalVariant(variant, note=capability_note(self.selected()))
        return EvalVariant(variant)

    def _eval_policy(self, c: View, make_env: Callable[[], Any], temperature: float,
                     adapters: dict[str, Path]) -> AbstractContextManager[Any]:
        """The base policy with `adapters` loaded: in-process, or with `model.server_url` on the servers,
        the adapter hot-swapped and checked there and unloaded after (`tracerl.evaluation.served`)."""
        if not c.model.server_url:
            return nullcontext(self.policy(c, temperature=temperature, seed=c.seed, adapters=adapters))
        from tracerl.evaluation.served import served_policy

        adapter = next(iter(adapters), None)
        return served_policy(c.model.server_url, c.model.base, make_env,
                             adapter=(adapter, adapters[adapter]) if adapter else None, temperature=temperature,
                             seed=c.seed, max_new_tokens=c.rollout.max_new_tokens, batch_size=c.rollout.batch_size,
                             served_dir=self.path(".served_adapters"), api_key=os.environ.get("OPENAI_API_KEY"))

    def report(self, c: View) -> dict[str, Any]:
        from tracerl.evaluation.report import build_report

        report = build_report(self.ws)
        return {"html": str(report.html_path)}


def trace_mode(modes: list[str]) -> str:
    """The composition mode whose variant is the report's TRACE: the first of `TRACE_VARIANTS` composed."""
    return next(m for m in TRACE_VARIANTS if m in modes)


def _llm_config(c: View):
    from tracerl.selection.llm import LLMConfig

    a = c.analysis
    return LLMConfig(base_url=a.base_url, model=a.model, api_key=os.environ.get(a.api_key_env))


class _progress:
    """A rich progress bar: `with _progress(console, label, total) as bar: … bar.advance() / bar.update(n)`."""

    def __init__(self, console: Console, label: str, total: int | None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.task = self.progress.add_task(label, total=total)

    def __enter__(self) -> _progress:
        self.progress.start()
        return self

    def advance(self, *_: Any) -> None:
        self.progress.advance(self.task, 1)

    def update(self, completed: int) -> None:
        self.progress.update(self.task, completed=completed)

    def __exit__(self, *exc: Any) -> bool:
        self.progress.stop()
        return False
