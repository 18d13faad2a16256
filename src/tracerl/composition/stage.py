"""`run_compose`: TRACE step 4 — capability adapters + base → one composed-model directory per mode —
what `tracerl compose` and the pipeline's compose stage both call, with one `ComposeConfig` (the run
config's `compose:` section).

The gates (moe) and the router's label head (router, merge) train on labelled rollouts, each with
`info["capability"]`: files given as they are (`tracerl compose --trajectories`), or rolled out here
by each adapter on its own capability's environment (the pipeline: `ComposeInputs.envs`) and written
to a gate-data folder. Every rollout's opening takes the gates' label loss; the LM loss goes to each
capability's successful rollouts, or for an adapter with no success its best-rewarded ones
(`examples.lm_kept`). When no composition learns from whole episodes (router, merge, moe routed at
the opening: `needs_gate_rollouts`), the gate data is the environments' openings and no episode is
played, so it costs no rollouts. A moe routed at the opening also fits its gates to the target's
failed openings, each toward the capabilities its episode lacked (`ComposeInputs.target`, from the
selection's labels: `target_lacking`), which costs no rollouts either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tracerl.composition.build import ComposeOptions, build_composition
from tracerl.composition.examples import lm_kept
from tracerl.composition.training import GateTrainingConfig
from tracerl.contracts import (
    CapabilitiesFile,
    Capability,
    CompositionSpec,
    GateData,
    GateKept,
    LabelRun,
    Workspace,
    lacking_capabilities,
)
from tracerl.core.errors import InputError
from tracerl.core.io import read_jsonl, write_jsonl
from tracerl.core.policy import Policy
from tracerl.core.sampling import RolloutSettings
from tracerl.core.trajectory import Trajectory
from tracerl.envs.runner import Episode, rollout
from tracerl.envs.synthetic.envdir import load_env_dir

Mode = Literal["moe", "router", "merge"]  # `tracerl.contracts.COMPOSITION_MODES`
GATE_SEED_OFFSET = 500_000  # gate-data episodes' seeds: apart from training's and evaluation's


class ComposeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    modes: list[Mode] = Field(default_factory=lambda: ["moe", "router"], description="compositions to build and evaluate")
    episodes_per_capability: int = Field(32, ge=1, description="gate-data episodes per capability environment: "
                                         "its adapter's rollouts when a composition learns from whole episodes "
                                         "(moe routed per token; they count in TRACE's rollout budget), else the "
                                         "episodes' openings (nothing played)")
    heldout_fraction: float = Field(0.2, ge=0, lt=1, description="share of those held out for routing accuracy")
    top_p: float = Field(0.9, gt=0, le=1, description="router: merge adapters until their α reach top_p")
    moe_routing: Literal["token", "opening"] = Field(
        "opening", description="moe: the gates' per-token majority over the episode's opening routes all of it "
                               "(opening), or each token routes itself (token)")
    target_openings: bool = Field(
        True, description="moe routed at the opening: fit the gates also to the target's failed train-split "
                          "openings, each toward the trained capabilities the selection's labels found its episode "
                          "lacked (else only the environments' openings, which route by resemblance)")
    gate: GateTrainingConfig = Field(default_factory=GateTrainingConfig)


@dataclass
class ComposeInputs:
    base: str  # the base model the adapters were trained on
    adapters: list[Path]  # one adapter folder per capability, in slot order
    capabilities: Path | list[Capability] | None = None  # a capabilities.json naming and describing them (its
    # selected ones all need an adapter), or the capabilities themselves, one per adapter
    trajectories: list[Path] = field(default_factory=list)  # labelled rollouts that train the gates …
    envs: dict[str, Path] = field(default_factory=dict)  # … or capability → environment, rolled out here
    target: list[Trajectory] = field(default_factory=list)  # failed target rollouts with info["lacking"]
    # (`target_lacking`): moe routed at the opening fits its gates to their openings too
    dtype: str | None = None  # the base's precision and device (`tracerl.models.placement` names; None: "auto")
    device: str | None = None


@dataclass
class ComposeRun:
    """What `run_compose` returns: each mode's composition.json, and the gate data it rolled out (if any)."""

    specs: dict[str, CompositionSpec]
    gate_data: GateData | None = None


def needs_gate_rollouts(config: ComposeConfig) -> bool:
    """Whether a composition of `config` learns from whole episodes: only moe routed per token (its
    gates' LM loss). The router's label head and gates routed at the opening learn from the openings."""
    return "moe" in config.modes and config.moe_routing == "token"


def fits_target_openings(config: ComposeConfig) -> bool:
    """Whether a composition of `config` fits its gates to the target's failed openings: moe routed at the opening."""
    return config.target_openings and "moe" in config.modes and config.moe_routing == "opening"


def roll_gate_data(envs: dict[str, Path], make_policy: Callable[[], Policy], episodes: int, out_dir: Path, *,
                   rollout_settings: RolloutSettings = RolloutSettings(),
                   openings_only: bool = False) -> tuple[GateData, list[Path]]:
    """`episodes` rollouts of each capability's adapter (loaded into `make_policy()`, built once when
    first needed, under the capability's name) on its environment, all to `out_dir/<capability>.jsonl`
    labelled with the capability (each opening trains the gates' label), and how many of them take the
    LM loss (`lm_kept`) to
    `out_dir/summary.json`. With `openings_only`, an environment whose opening holds the first user
    turn gives its openings instead (`env.reset` of the same seeds): no episode is played."""
    paths, rollouts, kept = [], 0, {}
    policy: Policy | None = None
    for cap, env_dir in envs.items():
        seeds = [GATE_SEED_OFFSET + i for i in range(episodes)]
        make_env = load_env_dir(env_dir)
        trajs = openings(make_env, seeds) if openings_only else None
        if trajs is not None:
            kept[cap] = GateKept(trajectories=0, of=0, source="openings", openings=len(trajs))
        else:
            policy = policy or make_policy()
            trajs = rollout(make_env, policy, [Episode(seed=s, adapter=cap) for s in seeds],
                            batch_size=rollout_settings.batch_size)
            rollouts += len(trajs)
            good, source = lm_kept(trajs)
            kept[cap] = GateKept(trajectories=len(good), of=len(trajs), source=source)
        path = out_dir / f"{cap}.jsonl"
        write_jsonl(path, [t.model_copy(update={"info": {**t.info, "capability": cap}}) for t in trajs])
        paths.append(path)
    data = GateData(rollouts=rollouts, kept=kept)
    data.write(out_dir / "summary.json")
    return data, paths


def target_lacking(rollouts: Path, selection: Path, capabilities: list[str]) -> list[Trajectory]:
    """The failed target rollouts (the file the selection labelled) that lacked one of `capabilities`,
    each with info["lacking"]: those its labels in `selection/labels/` found lacking in K of N runs
    (K and N from `selection/capabilities.json`)."""
    folder = Workspace(selection)
    params = CapabilitiesFile.read(folder.capabilities).params
    by_task = lacking_capabilities([LabelRun.read(folder.label_run(r)) for r in range(params.n)], capabilities, params.k)
    return [t.model_copy(update={"info": {**t.info, "lacking": by_task[t.task_id]}})
            for t in read_jsonl(rollouts, Trajectory) if by_task.get(t.task_id)]


def openings(make_env: Callable[[], Any], seeds: list[int]) -> list[Trajectory] | None:
    """Each seed's opening (`env.reset`) as an unplayed trajectory; None when an opening has no user turn."""
    out = []
    for seed in seeds:
        env = make_env()
        messages, info = env.reset(seed=seed)
        if not any(m.role == "user" for m in messages):
            return None
        out.append(Trajectory(task_id=str(info.get("task_id", seed)), domain=env.name, seed=seed, messages=messages,
                              tools=env.tools, termination="opening"))
    return out


def run_compose(inputs: ComposeInputs, config: ComposeConfig, out: dict[str, Path], *, seed: int,
                names: dict[str, str] | None = None, gate_dir: Path | None = None,
                make_policy: Callable[[], Policy] | None = None, rollout_settings: RolloutSettings = RolloutSettings(),
                labels: list[str] | None = None, router_fit: bool = True,
                on_gate_log: Callable[[dict], None] | None = None) -> ComposeRun:
    """Compose `inputs.adapters` in each of `config.modes` into `out[mode]` (served as `names[mode]`,
    default the folder's name). With `inputs.envs`, the gate data is first rolled out into `gate_dir`
    by `make_policy()` (the base with every adapter loaded under its capability's name)."""
    missing = [m for m in config.modes if m not in out]
    if missing:
        raise InputError(f"no output folder for mode {missing[0]!r}")
    gate_data, trajectories = None, list(inputs.trajectories)
    if inputs.envs:
        if trajectories or gate_dir is None or make_policy is None:
            raise InputError("gate data is either given (trajectories) or rolled out (envs, gate_dir, make_policy)")
        rolled = needs_gate_rollouts(config)
        gate_data, trajectories = roll_gate_data(inputs.envs, make_policy, config.episodes_per_capability,
                                                 gate_dir, rollout_settings=rollout_settings, openings_only=not rolled)
    specs = {}
    for mode in config.modes:
        options = ComposeOptions(
            mode=mode, capabilities_file=str(inputs.capabilities) if isinstance(inputs.capabilities, Path) else None,
            capabilities=inputs.capabilities if isinstance(inputs.capabilities, list) else None,
            trajectories=[str(p) for p in trajectories], heldout_fraction=config.heldout_fraction, gate=config.gate,
            top_p=config.top_p, moe_routing=config.moe_routing, labels=labels, model_name=(names or {}).get(mode), seed=seed,
            router_fit=router_fit,
            target=inputs.target if mode == "moe" and fits_target_openings(config) else [],
            dtype=inputs.dtype, device=inputs.device,
        )
        specs[mode] = build_composition([str(p) for p in inputs.adapters], inputs.base, out[mode], options,
                                        on_gate_log=on_gate_log)
    return ComposeRun(specs, gate_data)


def summary(run: ComposeRun) -> dict[str, Any]:
    """The compose stage's record: gate rollouts and each mode's held-out routing accuracy."""
    out: dict[str, Any] = {"gate_rollouts": run.gate_data.rollouts if run.gate_data is not None else 0}
    for mode, spec in run.specs.items():
        out[mode] = {"routing_accuracy": spec.routing_accuracy.overall if spec.routing_accuracy else None}
    out["dtype"] = next((spec.dtype for spec in run.specs.values()), None)
    return out
