"""`tracerl run`: the whole TRACE loop as resumable stages in one workspace folder.

    collect → select → synthesize (+calibrate) → train:<capability>… → compose → grpo_target
    → eval:<variant>… → report

Each stage reads only earlier stages' files, writes its own atomically and is skipped when its
outputs exist and its inputs and config are unchanged (`tracerl.stages`). Training resumes from
its last checkpoint, so killing a run anywhere and starting it again loses at most one step.

Workspace layout:
    config.yaml                      the resolved run config
    rollouts/base.jsonl              base-agent rollouts on the target's train split
    capabilities.json, labels/       step 1
    envs/<capability>/               step 2 (env.json, calibration.json)
    adapters/<capability>/           step 3 (PEFT adapter, metrics.jsonl, checkpoints)
    gate_data/<capability>.jsonl     successful adapter rollouts that train the gates
    composed/, composed_router/      step 4 (composition.json, gates.safetensors)
    baselines/grpo_target/           GRPO on the target with TRACE's rollout budget
    eval/<variant>.json|.jsonl       held-out evaluation
    report/index.html, report.json   the report
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from tracerl.config import RunConfig
from tracerl.core.errors import InputError
from tracerl.core.io import atomic_write_text, read_json, read_jsonl, write_json, write_jsonl
from tracerl.core.trajectory import Trajectory
from tracerl.evaluation.evaluate import play
from tracerl.stages import Stage, is_complete, run_stage
from tracerl.training.trainer import read_metrics

STAGES = ("collect", "select", "synthesize", "train", "compose", "grpo_target", "eval", "report")
TRACE_VARIANTS = {"moe": "trace_moe", "router": "trace_router", "merge": "trace_merge"}
COMPOSED_DIRS = {"moe": "composed", "router": "composed_router", "merge": "composed_merge"}


class Pipeline:
    def __init__(self, config: RunConfig, workspace: str | Path, *, console: Console | None = None):
        self.cfg = config
        self.ws = Path(workspace)
        self.console = console or Console(stderr=True)
        self.log: list[dict[str, Any]] = []
        self._forcing = False  # the running stage was forced (training then starts over)

    # --- shared helpers -------------------------------------------------------------------------
    def path(self, rel: str) -> Path:
        return self.ws / rel

    def target_env(self, split: str | None) -> Callable[[], Any]:
        from tracerl.envs.registry import make_env

        return lambda: make_env(self.cfg.target.env, split=split)

    def policy(self, *, temperature: float, seed: int, adapters: dict[str, Path] | None = None):
        """A local policy over a fresh copy of the base model (adapters mutate the model they load into)."""
        from tracerl.models.local import LocalPolicy, load_model

        model, tokenizer = load_model(self.cfg.model.base)
        policy = LocalPolicy(model, tokenizer, temperature=temperature, seed=seed,
                             max_new_tokens=self.cfg.model.max_new_tokens, max_batch_size=self.cfg.model.batch_size)
        for name, path in (adapters or {}).items():
            policy.load_adapter(name, path)
        return policy

    def selected(self) -> list[dict[str, Any]]:
        from tracerl.synthesis.synthesize import read_selected_capabilities

        return read_selected_capabilities(self.path("capabilities.json"))

    def built_envs(self) -> list[str]:
        index = self.path("envs/index.json")
        return list(read_json(index)["capabilities"]) if index.exists() else []

    def trace_rollouts(self) -> int:
        """Rollouts TRACE consumed: every adapter's GRPO rollouts plus the gate-training rollouts."""
        total = 0
        for cap in self.built_envs():
            rows = read_metrics(self.path(f"adapters/{cap}/metrics.jsonl"))
            total += rows[-1]["rollouts_used"] if rows else 0
        gate = self.path("gate_data/summary.json")
        return total + (read_json(gate)["rollouts"] if gate.exists() else 0)

    # --- the stage graph ---------------------------------------------------------------------------
    def stages(self) -> list[Stage]:
        """The stages runnable now (later stages depend on what earlier ones wrote)."""
        cfg = self.cfg
        out: list[Stage] = [
            Stage("collect", self.collect, outputs=["rollouts/base.jsonl"],
                  config=[cfg.seed, cfg.model.base, cfg.target.model_dump(), cfg.collect.model_dump()]),
            Stage("select", self.select, inputs=["rollouts/base.jsonl"], outputs=["capabilities.json"],
                  config=[cfg.seed, cfg.select.model_dump(), cfg.analysis.model_dump()]),
            Stage("synthesize", self.synthesize, inputs=["capabilities.json"], outputs=["envs/index.json"],
                  config=[cfg.seed, cfg.model.base, cfg.target.model_dump(), cfg.synthesize.model_dump()]),
        ]
        if self.cfg.target.results is not None:
            return out  # an imported target: selection and synthesis only (no simulator to train or evaluate on)
        train_cfg = [cfg.seed, cfg.model.base, cfg.train.model_dump()]
        for cap in self.built_envs():
            out.append(Stage(f"train:{cap}", lambda cap=cap: self.train(cap), inputs=[f"envs/{cap}"],
                             outputs=[f"adapters/{cap}/adapter_model.safetensors"], config=train_cfg))
        caps = self.built_envs()
        adapters = [f"adapters/{c}/adapter_model.safetensors" for c in caps]
        out.append(Stage("compose", self.compose, inputs=adapters + ["capabilities.json"],
                         outputs=[f"{COMPOSED_DIRS[m]}/composition.json" for m in cfg.compose.modes],
                         config=[cfg.seed, cfg.compose.model_dump()]))
        if cfg.baselines.grpo_target:
            out.append(Stage("grpo_target", self.grpo_target, inputs=adapters + ["gate_data/summary.json"],
                             outputs=["baselines/grpo_target/adapter_model.safetensors"], config=train_cfg))
        eval_cfg = [cfg.seed, cfg.eval.model_dump(), cfg.model.model_dump()]
        for variant, inputs in self.variants().items():
            out.append(Stage(f"eval:{variant}", lambda v=variant: self.evaluate(v), inputs=inputs,
                             outputs=[f"eval/{_stem(variant)}.json"], config=eval_cfg))
        out.append(Stage("report", self.report, inputs=["eval", "capabilities.json", "envs"],
                         outputs=["report/index.html", "report/report.json"], config=[]))
        return out

    def variants(self) -> dict[str, list[str]]:
        """Evaluated variants → the files their result depends on. `base` comes first (the others
        are compared with it)."""
        cfg, caps = self.cfg, self.built_envs()
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
            if only is not None and kind not in only and not is_complete(self.ws, stage):
                raise InputError(f"stage '{stage.name}' has not run (or its inputs changed): run `tracerl run` first",
                                 path=str(self.ws))
            forced = stage.name in force or kind in force
            self._forcing = forced
            ran, summary = run_stage(self.ws, stage, force=forced)
            done.add(stage.name)
            self.log.append({"stage": stage.name, "ran": ran, "summary": summary})
            if on_stage is not None:
                on_stage(stage.name, ran, summary)

    # --- stages ---------------------------------------------------------------------------------
    def collect(self) -> dict[str, Any]:
        cfg = self.cfg
        if cfg.target.results is not None:
            from tracerl.envs.loading import load_rollouts

            trajectories = load_rollouts(cfg.target.results, tools=cfg.target.tools)
        else:
            from tracerl.envs.airline import task_seeds

            policy = self.policy(temperature=cfg.collect.temperature, seed=cfg.seed)
            seeds = list(task_seeds("train", cfg.collect.tasks))
            with _progress(self.console, "collect", len(seeds)) as bar:
                trajectories = play(self.target_env("train"), policy, seeds, batch_size=cfg.model.batch_size,
                                    on_done=bar.advance)
        write_jsonl(self.path("rollouts/base.jsonl"), trajectories)
        passed = sum(t.passed for t in trajectories)
        return {"trajectories": len(trajectories), "passed": passed, "pass_rate": passed / max(1, len(trajectories))}

    def select(self) -> dict[str, Any]:
        from tracerl.selection.aggregate import SelectionParams
        from tracerl.selection.catalogue import builtin_capabilities, load_capabilities, merge_capabilities
        from tracerl.selection.discovery import discover
        from tracerl.selection.llm import ChatClient, LLMLabeller
        from tracerl.selection.rules import RulesLabeller
        from tracerl.selection.select import select_capabilities

        cfg = self.cfg.select
        trajectories = read_jsonl(self.path("rollouts/base.jsonl"), Trajectory)
        capabilities = builtin_capabilities()
        if cfg.capabilities:
            capabilities = merge_capabilities(capabilities, load_capabilities(cfg.capabilities))
        if cfg.discover:
            proposals = discover(ChatClient(self._llm_config()), trajectories, seed=self.cfg.seed)
            capabilities = merge_capabilities(capabilities, proposals)
        labeller = LLMLabeller(self._llm_config()) if cfg.labeler == "llm" else RulesLabeller()
        params = SelectionParams(rho=cfg.rho, delta=cfg.delta, runs=cfg.runs, min_runs=cfg.min_runs,
                                 bootstrap=cfg.bootstrap, seed=self.cfg.seed)
        document, _ = select_capabilities(trajectories, capabilities, labeller, params, out_dir=self.ws)
        if cfg.max_selected is not None:
            chosen = [c for c in document["capabilities"] if c["selected"]][: cfg.max_selected]
            for c in document["capabilities"]:
                if c["selected"] and c not in chosen:
                    c["selected"], c["status"] = False, None
                    c["note"] = f"dropped: select.max_selected = {cfg.max_selected}"
            write_json(self.path("capabilities.json"), document)
        names = [c["name"] for c in document["capabilities"] if c["selected"]]
        return {"selected": names}

    def _llm_config(self):
        from tracerl.selection.llm import LLMConfig

        a = self.cfg.analysis
        return LLMConfig(base_url=a.base_url, model=a.model, api_key=os.environ.get(a.api_key_env))

    def synthesize(self) -> dict[str, Any]:
        from tracerl.synthesis.synthesize import calibrate_env_dir, synthesize_capability
        from tracerl.synthesis.target import load_target

        cfg = self.cfg.synthesize
        caps = self.selected()
        if not caps:
            raise InputError("no capability was selected: nothing to train (see capabilities.json)",
                             path=str(self.path("capabilities.json")))
        target = load_target(self.cfg.target.tools or self.cfg.target.env)
        llm = None
        if cfg.generator == "llm":
            from openai import OpenAI

            a = self.cfg.analysis
            llm = (OpenAI(base_url=a.base_url, api_key=os.environ.get(a.api_key_env, "EMPTY")), a.model)
        built, report = [], {}
        for cap in caps:
            outcome = synthesize_capability(cap, target, self.path("envs"), generator=cfg.generator,
                                            difficulty=cfg.difficulty, llm=llm, max_rounds=cfg.max_rounds)
            report[cap["name"]] = {"source": outcome.source, "error": outcome.error}
            if not outcome.ok:
                self.console.print(f"[yellow]{cap['name']}: no environment ({outcome.error})[/]")
                continue
            if cfg.calibrate:
                policy = self.policy(temperature=cfg.temperature, seed=self.cfg.seed)
                with _progress(self.console, f"calibrate {cap['name']} (episodes, all rounds)", None) as bar:
                    result = calibrate_env_dir(outcome.env_dir, policy, seeds=cfg.calibration_seeds,
                                               group_size=cfg.group_size, bands=cfg.bands, max_rounds=cfg.max_rounds,
                                               settings={"temperature": cfg.temperature, "model": self.cfg.model.base},
                                               on_done=bar.advance)
                report[cap["name"]].update(accepted=result.accepted, difficulty=result.difficulty,
                                           success_rate=result.stats.success_rate)
            built.append(cap["name"])
        write_json(self.path("envs/index.json"), {"capabilities": built, "synthesis": report})
        return {"environments": built}

    def train(self, capability: str) -> dict[str, Any]:
        return self._train_adapter(self.path(f"envs/{capability}"), self.path(f"adapters/{capability}"),
                                   label=capability, env_source=f"envs/{capability}")

    def _train_adapter(self, env: Path | str, out: Path, *, label: str, env_source: str,
                       max_rollouts: int | None = None) -> dict[str, Any]:
        from tracerl.training.run import build_trainer, resolve_env

        make_env, _name, defaults = resolve_env(env)
        cfg = self.cfg.train
        updates: dict[str, Any] = {}
        if "hint_fraction" not in cfg.model_fields_set and defaults.get("hint_fraction"):
            updates["hint_fraction"] = float(defaults["hint_fraction"])
        if max_rollouts is not None:
            updates["max_rollouts"] = max_rollouts
            updates["max_steps"] = max(cfg.max_steps, 10_000)
        cfg = cfg.model_copy(update=updates)
        unit = "steps" if max_rollouts is None else "rollouts"
        with _progress(self.console, f"train {label} ({unit})", cfg.max_steps if max_rollouts is None else max_rollouts) as bar:
            def on_step(row: dict[str, Any]) -> None:
                bar.update(row["step"] if max_rollouts is None else row["rollouts_used"])

            resume = self._resumable(out, cfg, env_source)
            if not resume and out.exists():
                shutil.rmtree(out)  # a finished or stale run of other settings: start over
            trainer = build_trainer(cfg, self.cfg.model.base, make_env, out, env_source=env_source,
                                    server_url=self.cfg.model.server_url, on_step=on_step)
            rows = trainer.train(resume=resume)
        evals = [r["eval_success"] for r in rows if r.get("eval_success") is not None]
        return {"rollouts_used": rows[-1]["rollouts_used"] if rows else 0,
                "eval_success_first": evals[0] if evals else None, "eval_success_last": evals[-1] if evals else None}

    def _resumable(self, out: Path, cfg: Any, env_source: str) -> bool:
        """A training run left by a killed pipeline with these very settings is resumed; anything
        else (other settings, or `--force`) starts over."""
        saved = out / "train_config.json"
        if self._forcing or not saved.exists() or not any(out.glob("checkpoint*")):
            return False
        record = read_json(saved)
        return record.get("config") == cfg.model_dump() and record.get("env") == env_source \
            and record.get("base") == str(self.cfg.model.base)

    def compose(self) -> dict[str, Any]:
        from tracerl.composition.build import ComposeOptions, build_composition
        from tracerl.envs.runner import Episode, rollout
        from tracerl.synthesis.envdir import load_env_dir

        cfg = self.cfg.compose
        caps = self.built_envs()
        # Gate-training data: rollouts of each adapter on its own environment (seeds apart from
        # training and evaluation), labelled with the capability. TRACE trains the gates on the
        # successful ones; an adapter with no success contributes its best-rewarded rollouts
        # instead (recorded in gate_data/summary.json), so a weak agent still gets a router.
        policy = self.policy(temperature=self.cfg.train.temperature, seed=self.cfg.seed + 1,
                             adapters={c: self.path(f"adapters/{c}") for c in caps})
        paths, rollouts, kept = [], 0, {}
        for cap in caps:
            seeds = [500_000 + i for i in range(cfg.episodes_per_capability)]
            trajs = rollout(load_env_dir(self.path(f"envs/{cap}")), policy,
                            [Episode(seed=s, adapter=cap) for s in seeds], batch_size=self.cfg.model.batch_size)
            rollouts += len(trajs)
            good = [t for t in trajs if t.passed]
            source = "successful"
            if not good:
                best = max(t.reward for t in trajs)
                good, source = [t for t in trajs if t.reward == best], f"best reward {best:.2f} (no success)"
            kept[cap] = {"trajectories": len(good), "of": len(trajs), "source": source}
            path = self.path(f"gate_data/{cap}.jsonl")
            write_jsonl(path, [t.model_copy(update={"info": {**t.info, "capability": cap}}) for t in good])
            paths.append(str(path))
        write_json(self.path("gate_data/summary.json"), {"rollouts": rollouts, "kept": kept})
        summary: dict[str, Any] = {"gate_rollouts": rollouts}
        for mode in cfg.modes:
            options = ComposeOptions(mode=mode, capabilities_file=str(self.path("capabilities.json")),
                                     trajectories=paths, heldout_fraction=cfg.heldout_fraction, gate=cfg.gate,
                                     top_p=cfg.top_p, model_name=TRACE_VARIANTS[mode], seed=self.cfg.seed,
                                     successful_only=False)  # gate_data holds only what should train the gates
            spec = build_composition([str(self.path(f"adapters/{c}")) for c in caps], self.cfg.model.base,
                                     self.path(COMPOSED_DIRS[mode]), options)
            summary[mode] = {"routing_accuracy": getattr(spec, "routing_accuracy", None)}
        return summary

    def grpo_target(self) -> dict[str, Any]:
        budget = self.trace_rollouts()
        return self._train_adapter(self.cfg.target.env, self.path("baselines/grpo_target"), label="grpo_target",
                                   env_source=self.cfg.target.env, max_rollouts=budget)

    def evaluate(self, variant: str) -> dict[str, Any]:
        from tracerl.envs.airline import task_seeds
        from tracerl.evaluation.evaluate import WithSystemNote, capability_note, summarize_variant

        cfg = self.cfg.eval
        temperature = cfg.temperature if cfg.trials == 1 or cfg.temperature > 0 else 1.0  # k greedy trials would agree
        adapter, rollouts_used = None, 0
        if variant.startswith("trace_"):
            from tracerl.composition.artifact import load_composed
            from tracerl.composition.policy import ComposedPolicy

            mode = next(m for m, v in TRACE_VARIANTS.items() if v == variant)
            model = load_composed(self.path(COMPOSED_DIRS[mode]))
            policy = ComposedPolicy(model, temperature=temperature, seed=self.cfg.seed,
                                    max_new_tokens=self.cfg.model.max_new_tokens, max_batch_size=self.cfg.model.batch_size)
            rollouts_used = self.trace_rollouts()
        else:
            adapters = {}
            if variant == "grpo_target":
                adapters = {"grpo_target": self.path("baselines/grpo_target")}
                rollouts_used = read_metrics(self.path("baselines/grpo_target/metrics.jsonl"))[-1]["rollouts_used"]
            elif variant.startswith("adapter:"):
                cap = variant.split(":", 1)[1]
                adapters = {cap: self.path(f"adapters/{cap}")}
                rollouts_used = read_metrics(self.path(f"adapters/{cap}/metrics.jsonl"))[-1]["rollouts_used"]
            adapter = next(iter(adapters), None)
            policy = self.policy(temperature=temperature, seed=self.cfg.seed, adapters=adapters)
            if variant == "prompt_capabilities":
                policy = WithSystemNote(policy, capability_note(self.selected()))
        seeds = list(task_seeds("test", cfg.tasks))
        with _progress(self.console, f"eval {variant}", len(seeds) * cfg.trials) as bar:
            trajectories = play(self.target_env("test"), policy, seeds, trials=cfg.trials, adapter=adapter,
                                batch_size=self.cfg.model.batch_size, on_done=bar.advance)
        base_path = self.path("eval/base.json")
        base = read_json(base_path) if variant != "base" and base_path.exists() else None
        doc = summarize_variant(variant, trajectories, rollouts_used=rollouts_used,
                                capabilities=[c["name"] for c in self.selected()], base=base,
                                bootstrap=cfg.bootstrap, seed=self.cfg.seed)
        write_jsonl(self.path(f"eval/{_stem(variant)}.jsonl"), trajectories)
        write_json(self.path(f"eval/{_stem(variant)}.json"), doc)
        return {"pass1": doc["pass1"]["mean"], "rollouts_used": rollouts_used}

    def report(self) -> dict[str, Any]:
        from tracerl.evaluation.report import build_report

        report = build_report(self.ws)
        return {"html": str(report.html_path)}


def _stem(variant: str) -> str:
    return variant.replace(":", "-")


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
