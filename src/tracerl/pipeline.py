"""`tracerl run`: the whole TRACE loop as resumable stages in one workspace folder.

    collect → select → synthesize (+calibrate) → train:<capability>… → compose → grpo_target → swe_rl → gepa
    → curve → eval:<variant>… → report

Each stage reads only earlier stages' files, writes its own atomically and is skipped when its
outputs exist and its inputs and config are unchanged (`tracerl.stages`). A stage function is
given only the config sections it reads (`SECTIONS`, a `View`), and its cache key is every field
of them. Training resumes from its last checkpoint, so killing a run anywhere and starting it
again loses at most one step. An environment that calibration rejected stops the run before it
is trained, unless the config says `train_rejected: true` (or `informative`: not one whose
calibration groups all had equal rewards, where GRPO gets no gradient). The workspace's layout is
`tracerl.contracts.Workspace`'s. GEPA runs only with an analysis model (its reflection model);
without one it is skipped with a one-line note.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from tracerl.baselines.gepa import Reflection, run_gepa, seed_prompt
from tracerl.composition.stage import (
    ComposeInputs,
    fits_target_openings,
    run_compose,
    target_lacking,
)
from tracerl.composition.stage import summary as compose_summary
from tracerl.config import RunConfig, train_config
from tracerl.contracts import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    COMPOSITION_MODES,
    METRICS_FILE,
    CalibrationResult,
    CapabilitiesFile,
    CapabilityResult,
    CompositionSpec,
    EnvIndex,
    EvalResult,
    GateData,
    Workspace,
    composition_mode_of_variant,
    PromptOptimization,
    read_metrics,
)
from tracerl.core.errors import InputError
from tracerl.core.io import atomic_write_text, read_jsonl, write_json, write_jsonl
from tracerl.core.trajectory import Trajectory
from tracerl.envs.collect import run_collect, target_factory, task_seeds
from tracerl.envs.loading import load_rollouts
from tracerl.envs.registry import is_live_target
from tracerl.envs.tau2_live import load_tau2_settings
from tracerl.evaluation.curve import CurveInputs, run_curve
from tracerl.evaluation.evaluate import capability_note
from tracerl.evaluation.report import build_report
from tracerl.evaluation.served import LOCAL_NOTE, served_policy
from tracerl.evaluation.stage import EvalVariant, run_evaluate
from tracerl.models.local import LocalPolicy, load_model, resolved_dtype
from tracerl.models.analysis import AnalysisConfig
from tracerl.selection.rules import failures_by_capability
from tracerl.selection.stage import progress_steps, run_select
from tracerl.stages import Stage, View, is_complete, run_stage, stale_reasons
from tracerl.synthesis.stage import run_synthesize
from tracerl.synthesis.target import load_target, target_from_live_env
from tracerl.training.distributed import World
from tracerl.training.stage import TrainEnv, run_train

STAGES = ("collect", "select", "synthesize", "train", "compose", "grpo_target", "swe_rl", "gepa", "curve", "eval", "report")
BASELINES = ("grpo_target", "swe_rl")  # GRPO on the target at TRACE's rollout budget: its own reward, SWE-RL's
GEPA_SKIPPED = ("gepa: skipped — it needs an analysis model as its reflection model (analysis.base_url and "
                "analysis.model, or $OPENAI_BASE_URL and $TRACERL_LLM_MODEL)")
# The RunConfig sections each stage reads: its function gets only these, its key is all of them.
SECTIONS = {
    "collect": ["seed", "model", "rollout", "target", "collect"],
    "select": ["seed", "select", "analysis"],
    "synthesize": ["seed", "model", "rollout", "target", "synthesize", "analysis"],
    "train": ["seed", "model", "rollout", "train", "distributed"],
    "compose": ["seed", "model", "rollout", "compose", "train_rejected"],  # train_rejected: which adapters exist
    "grpo_target": ["seed", "model", "rollout", "target", "collect", "train", "train_rejected", "distributed"],
    "swe_rl": ["seed", "model", "rollout", "target", "collect", "train", "train_rejected", "distributed"],
    "gepa": ["seed", "model", "rollout", "target", "collect", "train", "train_rejected", "analysis", "gepa"],
    "curve": ["seed", "model", "rollout", "target", "collect", "train", "compose", "train_rejected"],
    "eval": ["seed", "model", "rollout", "target", "eval", "train_rejected"],
    "report": [],  # it reads the workspace, config.yaml included
}


class Pipeline:
    """The stage graph over one workspace: which stages exist, what each reads and writes, and in what order."""

    def __init__(self, config: RunConfig, workspace: str | Path, *, console: Console | None = None,
                 eval_server: str | None = None):
        self.cfg = config
        self.eval_server = eval_server  # `tracerl eval --server`: the eval stages' model.server_url
        self.ws = Workspace(workspace)
        self.stage_fns = StageFunctions(self.ws, console or Console(stderr=True))
        self.log: list[dict[str, Any]] = []

    def trained_envs(self) -> list[str]:
        return self.stage_fns.trained_envs(self.cfg.train_rejected)

    # --- the stage graph ---------------------------------------------------------------------------
    def stage(self, name: str, inputs: list[Path | str], outputs: list[Path], *args: Any) -> Stage:
        """Stage `name` (kind[:item]): its function called with its `View` of the config (and `args`).
        Inputs in the workspace are given as its paths, files elsewhere (a config's) as strings."""
        kind = name.split(":")[0]
        view = View(self.cfg, SECTIONS[kind])
        if kind == "eval" and self.eval_server:
            view.model = view.model.model_copy(update={"server_url": self.eval_server})
        fn = getattr(self.stage_fns, "evaluate" if kind == "eval" else kind)
        rel = [self.ws.rel(p) if isinstance(p, Path) else p for p in inputs]
        return Stage(name, lambda: fn(view, *args), inputs=rel, outputs=[self.ws.rel(p) for p in outputs],
                     config=view.key())

    def stages(self) -> list[Stage]:
        """The stages runnable now (later stages depend on what earlier ones wrote)."""
        cfg, ws = self.cfg, self.ws
        target_files: list[Path | str] = [p for p in (cfg.target.results, cfg.target.tools, cfg.target.tau2,
                                                      cfg.target.toolsandbox) if p is not None]
        policy: list[Path | str] = [cfg.target.policy] if cfg.target.policy is not None else []
        caps = self.trained_envs()
        live_tools = is_live_target(cfg.target.env) and cfg.target.tools is None  # read off the live target
        out: list[Stage] = [
            self.stage("collect", target_files, [ws.base_rollouts]),
            self.stage("select", [ws.base_rollouts] + ([cfg.select.capabilities] if cfg.select.capabilities else []),
                       [ws.capabilities]),
            self.stage("synthesize", [ws.capabilities, *target_files, *policy] + ([ws.base_rollouts] if live_tools else []),
                       [ws.env_index] + [ws.env(c) for c in caps]),
        ]
        if cfg.target.results is not None:
            return out  # an imported target: selection and synthesis only (no simulator to train or evaluate on)
        for cap in caps:
            out.append(self.stage(f"train:{cap}", [ws.env(cap)], [ws.adapter(cap) / ADAPTER_WEIGHTS,
                                                                    ws.adapter(cap) / METRICS_FILE], cap))
        adapters = [ws.adapter(c) / ADAPTER_WEIGHTS for c in caps]
        composed = [ws.composed(m) / "composition.json" for m in cfg.compose.modes]
        out.append(self.stage("compose", [*adapters, *(ws.env(c) for c in caps), ws.capabilities, ws.base_rollouts,
                                          ws.labels], composed + [ws.gate_summary]))
        for baseline in (b for b in BASELINES if getattr(cfg.baselines, b)):
            out.append(self.stage(baseline, [*adapters, ws.gate_summary, *target_files],
                                  [ws.baseline(baseline) / ADAPTER_WEIGHTS, ws.baseline(baseline) / METRICS_FILE]))
        if self.runs_gepa():
            out.append(self.stage("gepa", [*adapters, ws.gate_summary, ws.base_rollouts, *target_files],
                                  [ws.gepa_result]))
        if cfg.compose.modes:
            mode = trace_mode(cfg.compose.modes)
            out.append(self.stage("curve", [*self.composed_inputs(mode), ws.gate_summary, *target_files]
                                  + [ws.adapter(c) / f for c in caps for f in (METRICS_FILE, "snapshots")],
                                  [ws.curve_file]))
        for variant, inputs in self.variants().items():
            out.append(self.stage(f"eval:{variant}", [*inputs, *target_files], [ws.eval_result(variant)], variant))
        metrics = [ws.adapter(c) / METRICS_FILE for c in caps] + [ws.baseline(b) / METRICS_FILE for b in BASELINES]
        out.append(self.stage("report", [ws.config, ws.base_rollouts, ws.capabilities, ws.envs, ws.eval, ws.gate_summary,
                                         ws.curve_file, *metrics, *composed], [ws.report_html, ws.report_json]))
        return out

    def composed_inputs(self, mode: str) -> list[Path | str]:
        """What playing composition `mode` reads: its folder and the files of every adapter it names by
        path (composition.json; the trained adapters while it is not written yet)."""
        folder = self.ws.composed(mode)
        adapters = [self.ws.adapter(c) for c in self.trained_envs()]
        try:
            spec = CompositionSpec.read(folder / "composition.json")
            adapters += [folder / a.path for a in spec.adapters if (folder / a.path).is_dir()]
        except InputError:
            pass  # not written yet, or unreadable (the stage that reads it says so)
        files: list[Path | str] = [folder]
        for adapter in adapters:
            for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
                path = Path(os.path.normpath(adapter / name))
                named = path if path.is_relative_to(self.ws.root) else os.path.abspath(path)  # outside: by absolute path
                if named not in files:
                    files.append(named)
        return files

    def variants(self) -> dict[str, list[Path | str]]:
        """Evaluated variants → the files their result depends on. `base` comes first (the others
        are compared with it)."""
        cfg, ws, caps = self.cfg, self.ws, self.trained_envs()
        base = ws.eval_result("base")
        variants: dict[str, list[Path | str]] = {"base": []}
        for mode in cfg.compose.modes:
            variants[COMPOSITION_MODES[mode].variant] = [*self.composed_inputs(mode), base]
        for baseline in (b for b in BASELINES if getattr(cfg.baselines, b)):
            variants[baseline] = [ws.baseline(baseline) / ADAPTER_WEIGHTS, base]
        if cfg.baselines.prompt_capabilities:
            variants["prompt_capabilities"] = [ws.capabilities, base]
        if self.runs_gepa():
            variants["gepa"] = [ws.gepa_result, base]
        if cfg.baselines.single_adapters:
            for cap in caps:
                variants[f"adapter:{cap}"] = [ws.adapter(cap) / ADAPTER_WEIGHTS, base]
        return variants

    def runs_gepa(self) -> bool:
        """GEPA runs when it is on and an analysis model (its reflection model) is configured."""
        return self.cfg.baselines.gepa and _configured(self.cfg.analysis)

    def run(self, *, force: set[str] = frozenset(), only: set[str] | None = None,
            on_stage: Callable[[str, bool, dict], None] | None = None) -> None:
        """Run every stage that is not complete (and those in `force`). With `only`, the other
        stages must already be complete (e.g. `tracerl eval` on a trained workspace)."""
        unknown = {f.split(":")[0] for f in set(force) | set(only or ())} - set(STAGES)
        if unknown:
            raise InputError(f"unknown stage {sorted(unknown)[0]!r} (stages: {', '.join(STAGES)})")
        self.ws.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.ws.config, self.cfg.to_yaml())
        if self.cfg.baselines.gepa and not self.runs_gepa() and self.cfg.target.results is None:
            self.stage_fns.console.print(f"[yellow]{GEPA_SKIPPED}[/]", highlight=False, soft_wrap=True)
        done: set[str] = set()
        while True:
            pending = [s for s in self.stages() if s.name not in done]
            if not pending:
                return
            stage = pending[0]
            kind = stage.name.split(":")[0]
            if kind == "train" and not self.cfg.train_rejected:
                self.refuse_if_rejected(stage.name.split(":", 1)[1])
            if only is not None and kind not in only and not is_complete(self.ws.root, stage):
                raise InputError(f"stage '{stage.name}' has not run (or its inputs changed): run `tracerl run` first",
                                 path=str(self.ws.root))
            forced = stage.name in force or kind in force
            recorded = self.ws.stage_record(stage.name).exists()
            reasons = ["forced (--force)"] if forced else stale_reasons(self.ws.root, stage) if recorded else []
            if reasons:  # a stage that ran before runs again: say why
                self.stage_fns.console.print(f"[bold]{stage.name}[/] runs again: {'; '.join(reasons)}",
                                             highlight=False, soft_wrap=True)
            # A training run left in the stage's folder is resumed when the stage never finished (killed);
            # one the stage finished before, with other inputs or config, is replaced, as any stage's outputs are.
            self.stage_fns.forcing = bool(reasons)
            ran, summary = run_stage(self.ws.root, stage, force=forced)
            done.add(stage.name)
            self.log.append({"stage": stage.name, "ran": ran, "summary": summary, "reasons": reasons})
            if on_stage is not None:
                on_stage(stage.name, ran, summary)

    def refuse_if_rejected(self, capability: str) -> None:
        """Stop (exit 2) before training on an environment calibration rejected, naming its figures."""
        path = self.ws.env(capability) / "calibration.json"
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

    def __init__(self, workspace: Workspace, console: Console):
        self.ws = workspace
        self.console = console
        self.forcing = False  # training starts over, not resuming (`Pipeline.run` says when)

    # --- shared helpers -------------------------------------------------------------------------
    @staticmethod
    def target_env(c: View, split: str) -> Callable[[], Any]:
        settings = load_tau2_settings(c.target.tau2) if c.target.env.startswith("tau2:") and c.target.tau2 else None
        if c.target.toolsandbox is not None:  # ToolSandBox's settings file, read by its factory
            settings = {"settings": c.target.toolsandbox}
        return target_factory(c.target.env, split, settings)

    @staticmethod
    def dtype(c: View) -> str:
        """The precision every stage loads the base in: `model.dtype`, "auto" named (the checkpoint's own)."""
        return resolved_dtype(c.model.base, c.model.dtype)

    @staticmethod
    def policy(c: View, *, temperature: float, seed: int, adapters: dict[str, Path] | None = None) -> LocalPolicy:
        """A local policy over a fresh copy of the base model (adapters mutate the model they load into),
        in `model.dtype` on `model.device`."""
        model, tokenizer = load_model(c.model.base, device=c.model.device, dtype=StageFunctions.dtype(c))
        policy = LocalPolicy(model, tokenizer, temperature=temperature, seed=seed,
                             max_new_tokens=c.rollout.max_new_tokens, max_batch_size=c.rollout.batch_size,
                             kv_cache_tokens=c.rollout.kv_cache_tokens)
        for name, path in (adapters or {}).items():
            policy.load_adapter(name, path)
        return policy

    def validation_seeds(self, c: View) -> list[int]:
        """The validation episodes GRPO-on-target's checkpoints and TRACE's curve points are measured on:
        `train.eval_episodes` tasks of the target's train split, right after the ones collect played (none
        of them is trained on: GRPO draws another seed for one)."""
        n = train_config(c.train, c.rollout, c.seed).eval_episodes
        return task_seeds(self.target_env(c, "train"), "train", n, offset=c.collect.tasks) if n else []

    def selected(self) -> list[CapabilityResult]:
        return CapabilitiesFile.read(self.ws.capabilities).selected()

    def trained_envs(self, train_rejected: bool | str) -> list[str]:
        """The environments adapters are trained on under the config's `train_rejected`, in selection order."""
        index = self.ws.env_index
        return EnvIndex.read(index).trainable(train_rejected == "informative") if index.exists() else []

    def trace_rollouts(self, c: View) -> int:
        """Rollouts TRACE consumed: every adapter's GRPO rollouts plus the gate-training rollouts."""
        total = 0
        for cap in self.trained_envs(c.train_rejected):
            rows = read_metrics(self.ws.adapter(cap) / METRICS_FILE)
            total += rows[-1].rollouts_used if rows else 0
        gate = self.ws.gate_summary
        return total + (GateData.read(gate).rollouts if gate.exists() else 0)

    # --- stages ---------------------------------------------------------------------------------
    def collect(self, c: View) -> dict[str, Any]:
        if c.target.results is not None:
            trajectories = load_rollouts(c.target.results, tools=c.target.tools)
            write_jsonl(self.ws.base_rollouts, trajectories)
        else:
            with _progress(self.console, "collect", c.collect.tasks) as bar:
                trajectories = run_collect(self.target_env(c, "train"),
                                           lambda: self.policy(c, temperature=c.collect.temperature, seed=c.seed),
                                           c.collect, self.ws.base_rollouts, split="train", rollout_settings=c.rollout,
                                           on_done=bar.advance).trajectories
        passed = sum(t.passed for t in trajectories)
        return {"trajectories": len(trajectories), "passed": passed, "pass_rate": passed / max(1, len(trajectories)),
                **({"dtype": self.dtype(c)} if c.target.results is None else {})}

    def select(self, c: View) -> dict[str, Any]:
        trajectories = read_jsonl(self.ws.base_rollouts, Trajectory)
        with _progress(self.console, f"select ({c.select.labeler})", progress_steps(c.select, len(trajectories))) as bar:
            result = run_select(trajectories, c.select, seed=c.seed, out_dir=self.ws.root, llm=c.analysis,
                                on_step=bar.advance)
        if result.analysis is not None:
            self.console.print(f"analysis model: {result.analysis}", highlight=False)
        summary: dict[str, Any] = {"selected": [x.name for x in result.document.selected()]}
        return summary if result.analysis is None else {**summary, "analysis": result.analysis}

    def synthesize(self, c: View) -> dict[str, Any]:
        cfg = c.synthesize
        if is_live_target(c.target.env) and c.target.tools is None:  # the live benchmark states its own tools
            played = read_jsonl(self.ws.base_rollouts, Trajectory)
            target = target_from_live_env(self.target_env(c, "train")(), played, source=c.target.env)
        else:
            target = load_target(c.target.tools or c.target.env, policy=c.target.policy)
        llm = c.analysis if cfg.generator == "llm" or _configured(c.analysis) else None

        def no_env(outcome: Any) -> None:
            if not outcome.ok:
                self.console.print(f"[yellow]{outcome.capability}: no environment ({outcome.error})[/]")

        with _progress(self.console, "calibrate (episodes, all capabilities and rounds)", None) as bar:
            run = run_synthesize(self.ws.capabilities, target, self.ws.envs, cfg,
                                 make_policy=lambda: self.policy(c, temperature=cfg.temperature, seed=c.seed),
                                 policy_info={"model": c.model.base, "max_new_tokens": c.rollout.max_new_tokens,
                                              "dtype": self.dtype(c)},
                                 llm=llm, on_episode=bar.advance, on_outcome=no_env)
        if run.analysis is not None:
            self.console.print(f"analysis model (environment writer): {run.analysis}", highlight=False)
        return {"environments": run.index.built(), "dtype": self.dtype(c)}

    def train(self, c: View, capability: str, world: World | None = None) -> dict[str, Any]:
        if world is None and c.distributed.nproc_per_node > 1:
            return self._launch(c, f"train:{capability}")
        env = TrainEnv.resolve(self.ws.env(capability))
        env.source = self.ws.rel(self.ws.env(capability))  # workspace-relative: a moved workspace resumes its runs
        return self._train_adapter(c, env, self.ws.adapter(capability), label=capability, world=world)

    def _launch(self, c: View, stage: str) -> dict[str, Any]:
        """The training stage `stage` under torchrun (`distributed.nproc_per_node` ranks, on `distributed.devices`):
        `tracerl.pipeline_ranks` runs it on every rank; rank 0 prints the stage's summary."""
        gc.collect()
        if torch.cuda.is_available():  # the earlier stages' models: their GPU memory back for the ranks
            torch.cuda.empty_cache()
        n = c.distributed.nproc_per_node
        sections = self.ws.stage_launch(stage)  # the view, as given (unset stays unset)
        write_json(sections, {name: v.model_dump(mode="json", exclude_unset=True) if isinstance(v, BaseModel) else v
                              for name, v in vars(c).items()})
        torchrun = Path(sys.executable).parent / "torchrun"
        command = [str(torchrun) if torchrun.exists() else "torchrun", "--standalone", f"--nproc_per_node={n}",
                   "-m", "tracerl.pipeline_ranks", str(self.ws.root.resolve()), stage, "--sections",
                   str(sections.resolve())]
        command += ["--force"] if self.forcing else []
        env = dict(os.environ)
        if c.distributed.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, c.distributed.devices))
        with _progress(self.console, f"{stage} (torchrun, {n} ranks)", None):
            run = subprocess.run(command, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            lines = [x for x in (run.stderr or run.stdout).strip().splitlines() if x.strip()]
            reason = next((x for x in reversed(lines) if "InputError" in x or x.startswith("error")), lines[-1] if lines else "")
            raise InputError(f"{stage}: torchrun with {n} ranks failed (exit {run.returncode}): {reason[:500]}",
                             path=str(self.ws.root))
        return json.loads(run.stdout.strip().splitlines()[-1])

    def _train_adapter(self, c: View, env: TrainEnv, out: Path, *, label: str, max_rollouts: int | None = None,
                       heldout: list[int] | None = None, world: World | None = None) -> dict[str, Any]:
        """`run_train` on `env` into `out`, with this stage's config (`heldout`: the held-out seeds, when not
        the config's own; `world`: the ranks, under `tracerl.pipeline_ranks`)."""
        cfg = train_config(c.train, c.rollout, c.seed)
        if max_rollouts is not None:
            cfg = cfg.model_copy(update={"max_rollouts": max_rollouts, "max_steps": max(cfg.max_steps, 10_000)})
        if heldout:
            if heldout != list(range(heldout[0], heldout[0] + len(heldout))):
                raise InputError(f"target {c.target.env}: its validation tasks {heldout[:3]}… are not consecutive seeds")
            cfg = cfg.model_copy(update={"eval_seed_start": heldout[0]})
        unit = "steps" if max_rollouts is None else "rollouts"
        with _progress(self.console, f"train {label} ({unit})", cfg.max_steps if max_rollouts is None else max_rollouts) as bar:
            def on_step(row: dict[str, Any]) -> None:
                bar.update(row["step"] if max_rollouts is None else row["rollouts_used"])

            summary = run_train(env, c.model.base, out, cfg, force=self.forcing, server_url=c.model.server_url,
                                on_step=on_step, dtype=c.model.dtype, device=c.model.device, world=world or World(),
                                served_tolerance=c.model.served_tolerance)
        return summary.model_dump(include={"rollouts_used", "eval_success_first", "eval_success_last", "resumed", "dtype"})

    def compose(self, c: View) -> dict[str, Any]:
        caps = self.trained_envs(c.train_rejected)
        if not caps:
            built = EnvIndex.read(self.ws.env_index).built()
            why = (f"calibration found no group of mixed rewards in {', '.join(built)}, and train_rejected: informative "
                   "leaves those out (train_rejected: true trains them anyway)") if built else \
                "synthesis built no environment (envs/index.json says why for each capability)"
            raise InputError(f"no adapter to compose: {why}", path=str(self.ws.env_index))
        selected = {cap.name: cap.definition() for cap in self.selected()}
        inputs = ComposeInputs(base=c.model.base, adapters=[self.ws.adapter(cap) for cap in caps],
                               capabilities=[selected[cap] for cap in caps],  # those trained (`trained_envs`)
                               envs={cap: self.ws.env(cap) for cap in caps},
                               target=target_lacking(self.ws.base_rollouts, self.ws.root, caps)
                               if fits_target_openings(c.compose) else [], dtype=self.dtype(c), device=c.model.device)
        run = run_compose(inputs, c.compose, {m: self.ws.composed(m) for m in c.compose.modes}, seed=c.seed,
                          names={m: COMPOSITION_MODES[m].variant for m in c.compose.modes}, gate_dir=self.ws.gate_data,
                          rollout_settings=c.rollout,
                          make_policy=lambda: self.policy(c, temperature=c.rollout.temperature, seed=c.seed + 1,
                                                          adapters=dict(zip(caps, inputs.adapters))))
        return compose_summary(run)

    def grpo_target(self, c: View, world: World | None = None) -> dict[str, Any]:
        if world is None and c.distributed.nproc_per_node > 1:
            return self._launch(c, "grpo_target")
        env = TrainEnv(self.target_env(c, "train"), source=c.target.env, name=c.target.env,
                       make_eval=self.target_env(c, "train"))
        return self._train_adapter(c, env, self.ws.baseline("grpo_target"), label="grpo_target",
                                   max_rollouts=self.trace_rollouts(c), heldout=self.validation_seeds(c), world=world)

    def swe_rl(self, c: View, world: World | None = None) -> dict[str, Any]:
        """SWE-RL's baseline: GRPO on the target's train split rewarded by the submitted patch's similarity
        to the gold patch (the target's `reward="swe_rl"`), its checkpoints evaluated on the validation
        episodes by the target's own reward, as GRPO-on-target's."""
        if world is None and c.distributed.nproc_per_node > 1:
            return self._launch(c, "swe_rl")
        train = target_factory(c.target.env, "train", {"reward": "swe_rl"})
        train()  # a target without SWE-RL's reward fails here, in one line
        env = TrainEnv(train, source=f"{c.target.env} (reward swe_rl)", name="swe_rl",
                       make_eval=self.target_env(c, "train"))
        return self._train_adapter(c, env, self.ws.baseline("swe_rl"), label="swe_rl",
                                   max_rollouts=self.trace_rollouts(c), heldout=self.validation_seeds(c), world=world)

    def gepa(self, c: View) -> dict[str, Any]:
        """GEPA's system prompt within TRACE's rollout budget on the target's train split; its running-best
        prompts are also played on the validation episodes GRPO-on-target's checkpoints are measured on."""
        analysis = c.analysis.resolved()  # the stage exists only with an analysis model (`Pipeline.runs_gepa`)
        budget = c.gepa.max_rollouts or self.trace_rollouts(c)
        reflection = Reflection(base_url=analysis.base_url, model=analysis.model, api_key=analysis.api_key,
                                temperature=c.gepa.reflection_temperature, max_tokens=c.gepa.reflection_max_tokens,
                                seed=c.seed)
        seed_text = seed_prompt(read_jsonl(self.ws.base_rollouts, Trajectory))
        make_env = self.target_env(c, "train")
        with _progress(self.console, "gepa (rollouts)", budget) as bar, \
                self._eval_policy(c, make_env, c.gepa.temperature, {}) as policy:  # the base model, in-process or served
            result = run_gepa(make_env=make_env, policy=policy, config=c.gepa, budget=budget, reflection=reflection,
                              seed_text=seed_text, seed=c.seed, curve_seeds=self.validation_seeds(c),
                              batch_size=c.rollout.batch_size, on_rollout=bar.update)
        result.write(self.ws.gepa_result)
        best = result.candidates[result.best]
        return {"rollouts_used": result.rollouts_used, "budget": budget, "candidates": len(result.candidates),
                "best": result.best, "best_val_score": best.val_score, "seed_val_score": result.candidates[0].val_score}

    def curve(self, c: View) -> dict[str, Any]:
        mode = COMPOSITION_MODES[trace_mode(c.compose.modes)]
        gate = self.ws.gate_summary
        cfg = train_config(c.train, c.rollout, c.seed)
        inputs = CurveInputs(variant=mode.variant, composed=self.ws.composed(mode.name),
                             adapters={cap: self.ws.adapter(cap) for cap in self.trained_envs(c.train_rejected)},
                             gate_rollouts=GateData.read(gate).rollouts if gate.exists() else 0,
                             seeds=self.validation_seeds(c), device=c.model.device)
        with _progress(self.console, f"curve {inputs.variant} (episodes)", None) as bar:
            curve = run_curve(inputs, c.rollout, self.target_env(c, "train"), self.ws.curve, seed=cfg.seed,
                              on_done=bar.advance)
        return {"points": [[p.rollouts, p.success] for p in curve.points], "note": curve.note}

    def evaluate(self, c: View, variant: str) -> dict[str, Any]:
        played = self.eval_variant(c, variant)
        if played.composed is not None and c.model.server_url:
            self.console.print(f"[yellow]{LOCAL_NOTE.format(variant=variant, url=c.model.server_url)}[/]", highlight=False)
        make_env = self.target_env(c, "test")
        base_path = self.ws.eval_result("base")
        selected = [x.name for x in self.selected()]
        with _progress(self.console, f"eval {variant}", c.eval.tasks * c.eval.trials) as bar:
            result = run_evaluate(played, make_env, c.eval, self.ws.eval, seed=c.seed, rollout=c.rollout,
                                  make_policy=lambda temperature, adapters: self._eval_policy(c, make_env, temperature,
                                                                                              adapters),
                                  count_failures=lambda trajectories: failures_by_capability(trajectories, selected),
                                  base=EvalResult.read(base_path) if variant != "base" and base_path.exists() else None,
                                  tau2_results=c.target.env.startswith("tau2:"), on_done=bar.advance,
                                  dtype=self.dtype(c), device=c.model.device)
        return {"pass1": result.pass1.mean, "rollouts_used": played.rollouts_used, "dtype": result.dtype}

    def eval_variant(self, c: View, variant: str) -> EvalVariant:
        """What plays as `variant` in this workspace, and the rollouts its training consumed."""
        mode = composition_mode_of_variant(variant)
        if mode is not None:
            return EvalVariant(variant, composed=self.ws.composed(mode.name), rollouts_used=self.trace_rollouts(c))
        if variant in BASELINES or variant.startswith("adapter:"):
            name = variant.split(":", 1)[-1]
            folder = self.ws.baseline(variant) if variant in BASELINES else self.ws.adapter(name)
            return EvalVariant(variant, adapters={name: folder},
                               rollouts_used=read_metrics(folder / METRICS_FILE)[-1].rollouts_used)
        if variant == "gepa":
            result = PromptOptimization.read(self.ws.gepa_result)
            return EvalVariant(variant, system_prompt=result.best_prompt, rollouts_used=result.rollouts_used)
        if variant == "prompt_capabilities":
            return EvalVariant(variant, note=capability_note(self.selected()))
        return EvalVariant(variant)

    def _eval_policy(self, c: View, make_env: Callable[[], Any], temperature: float,
                     adapters: dict[str, Path]) -> AbstractContextManager[Any]:
        """The base policy with `adapters` loaded: in-process, or with `model.server_url` on the servers,
        the adapter hot-swapped and checked there and unloaded after (`tracerl.evaluation.served`)."""
        if not c.model.server_url:
            return nullcontext(self.policy(c, temperature=temperature, seed=c.seed, adapters=adapters))
        adapter = next(iter(adapters), None)
        return served_policy(c.model.server_url, c.model.base, make_env,
                             adapter=(adapter, adapters[adapter]) if adapter else None, temperature=temperature,
                             seed=c.seed, max_new_tokens=c.rollout.max_new_tokens, batch_size=c.rollout.batch_size,
                             served_dir=self.ws.served_adapters, api_key=os.environ.get("OPENAI_API_KEY"),
                             dtype=self.dtype(c), device=c.model.device, served_tolerance=c.model.served_tolerance)

    def report(self, c: View) -> dict[str, Any]:
        report = build_report(self.ws.root)
        return {"html": str(report.html_path)}


def trace_mode(modes: list[str]) -> str:
    """The composition mode whose variant is the report's TRACE: the first of `COMPOSITION_MODES` composed."""
    return next(m for m in COMPOSITION_MODES if m in modes)


def _configured(analysis: AnalysisConfig) -> bool:
    """Whether the analysis model's endpoint and name are given (in the config or the environment)."""
    try:
        analysis.resolved()
    except InputError:
        return False
    return True


class _progress:
    """A rich progress bar: `with _progress(console, label, total) as bar: … bar.advance() / bar.update(n)`."""

    def __init__(self, console: Console, label: str, total: int | None):
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
