"""Step 4 end to end: adapters + base (+ rollouts) → a composed-model directory.

1. Load the base and the adapters, check they fit, name the capabilities (from a
   capabilities.json when given, else the adapter directory names).
2. Split the labelled trajectories (each with `info["capability"]`) per capability into a
   training part and a held-out part (seeded).
3. moe routed per token: train the gates on the training part (`training.train_gates`); routed at
   the opening: fit them, layer by layer, to the training part's openings (`opening_fit`) and to
   the target's failed openings, each toward the capabilities its episode lacked (`target`).
   router / merge: set up the task router and calibrate its label head on the training part's
   first user turns (`router_fit`; off: the pure zero-shot router).
4. Measure routing accuracy on the held-out prompts; write gates.safetensors and composition.json.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerl.composition.accuracy import prompts_from_trajectories, routing_accuracy
from tracerl.composition.examples import examples_from_trajectories, lacking_example
from tracerl.composition.opening_fit import fit_gates_to_openings
from tracerl.composition.training import GateTrainingConfig, train_gates
from tracerl.contracts import CapabilitiesFile, Capability, CompositionSpec
from tracerl.core.errors import InputError
from tracerl.core.io import read_jsonl
from tracerl.core.trajectory import Trajectory
from tracerl.models.composed.adapters import LoRAAdapter, load_adapter
from tracerl.models.composed.artifact import save_composed, spec_for
from tracerl.models.composed.composition import Composition, adapter_capability, compose
from tracerl.models.composed.examples import prompt_example
from tracerl.models.composed.router import request_of
from tracerl.models.local import load_model
from tracerl.models.placement import dtype_name


@dataclass
class ComposeOptions:
    mode: str = "moe"
    moe_routing: str = "token"  # moe: route each token, or each episode from its opening (contracts.MOE_ROUTINGS)
    capabilities_file: str | None = None  # a capabilities.json naming the adapters' capabilities
    capabilities: list[Capability] | None = None  # or the capabilities themselves (one per adapter, by name)
    trajectories: list[str] = field(default_factory=list)
    heldout_fraction: float = 0.2
    gate: GateTrainingConfig = field(default_factory=GateTrainingConfig)
    top_p: float = 0.9
    labels: list[str] | None = None
    model_name: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # the LM loss on every trajectory (smoke runs); by default on each capability's successful ones
    # (TRACE), else its best rewarded — the label loss takes every trajectory's opening either way
    lm_on_all: bool = False
    # moe routed at the opening: failed target episodes, each with info["lacking"] (the capabilities
    # the selection's labels found it lacked); their openings join the fit, so the gates route the
    # target's tasks by what its failures lack and not only by resemblance to an environment's openings
    target: list[Trajectory] = field(default_factory=list)
    router_fit: bool = True  # router/merge: calibrate the label head on the training trajectories' first user turns
    router_fit_steps: int = 300
    seed: int = 0
    dtype: str | None = None  # the base's precision and device (`tracerl.models.placement` names; None: "auto")
    device: str | None = None


def capabilities_for(adapters: list[LoRAAdapter], capabilities_file: str | None,
                     capabilities: list[Capability] | None = None) -> list[Capability]:
    """One Capability per adapter, in adapter order: from a capabilities.json (it must name every
    adapter, and its selected capabilities must all have one), from `capabilities` (by name), or
    else each adapter's name."""
    if capabilities_file is not None:
        rows = CapabilitiesFile.read(capabilities_file).capabilities
        by_name = {c.name: c.definition() for c in rows}
        wanted = {c.name for c in rows if c.selected}
    elif capabilities is not None:
        by_name = {c.name: c for c in capabilities}
        wanted = set(by_name)
    else:
        return [adapter_capability(a.name, a.name.replace("_", " ")) for a in adapters]
    missing = [a.name for a in adapters if a.name not in by_name]
    if missing:
        raise InputError(f"the capability list does not match the adapters: no capability named {missing}", path=capabilities_file)
    orphans = sorted(wanted - {a.name for a in adapters})
    if orphans:
        raise InputError(f"the capability list does not match the adapters: no adapter for {orphans}", path=capabilities_file)
    return [by_name[a.name] for a in adapters]


def split_heldout(trajectories: list[Trajectory], fraction: float, seed: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """Per capability, a seeded `fraction` of the trajectories (at least one when there are two) is held out."""
    if not 0.0 <= fraction < 1.0:
        raise InputError(f"heldout fraction must be in [0, 1), got {fraction}")
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(str(t.info.get("capability")), []).append(t)
    train, heldout = [], []
    rng = random.Random(seed)
    for name in sorted(groups):
        items = list(groups[name])
        rng.shuffle(items)
        k = round(len(items) * fraction)
        if fraction > 0 and k == 0 and len(items) >= 2:
            k = 1
        heldout += items[:k]
        train += items[k:]
    return train, heldout


def load_trajectories(paths: list[str], known: list[str]) -> list[Trajectory]:
    out: list[Trajectory] = []
    for path in paths:
        for t in read_jsonl(path, Trajectory):
            capability = t.info.get("capability")
            if capability not in known:
                raise InputError(f"trajectory {t.task_id}: info.capability {capability!r} is not one of {known}", path=path)
            out.append(t)
    return out


def build_composition(
    adapter_dirs: list[str],
    base: str,
    out: str | Path,
    options: ComposeOptions,
    *,
    on_gate_log: Callable[[dict], None] | None = None,
    loaded_base: tuple[Any, Any] | None = None,
) -> CompositionSpec:
    """Compose, train/measure, write `out`; returns the written composition.json contents."""
    if options.target and options.mode == "moe" and options.moe_routing != "opening":
        raise InputError("the target's openings fit only the gates of a moe routed at the opening")
    if not adapter_dirs:
        raise InputError("give at least one adapter directory")
    adapters = [load_adapter(d) for d in adapter_dirs]
    capabilities = capabilities_for(adapters, options.capabilities_file, options.capabilities)
    trajectories = load_trajectories(options.trajectories, [c.name for c in capabilities])
    model, tokenizer = loaded_base if loaded_base is not None else load_model(base, device=options.device,
                                                                                dtype=options.dtype)
    composition = compose(model, adapters, capabilities, mode=options.mode, moe_routing=options.moe_routing,  # type: ignore[arg-type]
                          tokenizer=tokenizer, router_labels=options.labels, template_kwargs=options.template_kwargs,
                          top_p=options.top_p, name=options.model_name, base_ref=base, seed=options.seed)
    train, heldout = split_heldout(trajectories, options.heldout_fraction, options.seed)
    gate_summary = _train(composition, tokenizer, train, options, on_gate_log) if options.mode == "moe" else None
    router_fit = None
    if options.mode != "moe" and options.router_fit and train:
        slot_of = {c.name: i for i, c in enumerate(capabilities, start=1)}
        router_fit = composition.router.fit([request_of(t.messages) for t in train],
                                            [slot_of[str(t.info["capability"])] for t in train], steps=options.router_fit_steps)
    accuracy = routing_accuracy(composition, tokenizer, prompts_from_trajectories(heldout)) if heldout else None
    spec = spec_for(
        composition, base, Path(out), model_name=options.model_name, gate_training=gate_summary,
        routing_accuracy=accuracy, template_kwargs=options.template_kwargs, router_fit=router_fit,
        dtype=dtype_name(model),
    )
    save_composed(composition, spec, out)
    return spec


def _train(composition: Composition, tokenizer, train: list[Trajectory], options: ComposeOptions, on_log) -> dict | None:
    if not train:
        return None
    slot_of = {c.name: i for i, c in enumerate(composition.capabilities, start=1)}
    if composition.moe_routing == "opening":
        openings = [prompt_example(tokenizer, t.messages, t.tools, slot_of[str(t.info["capability"])]) for t in train]
        targets = [lacking_example(tokenizer, t, slots, composition.num_slots) for t in options.target
                   if (slots := [slot_of[c] for c in t.info.get("lacking", []) if c in slot_of])]
        layers = fit_gates_to_openings(composition, openings + targets, options.gate, on_log=on_log)
        return {"method": "opening fit, layer by layer (L-BFGS)", "max_iter": options.gate.max_steps,
                "examples": len(openings), "target_openings": len(targets), "layers": layers}
    examples = examples_from_trajectories(tokenizer, train, slot_of, lm_on_all=options.lm_on_all)
    if not examples:
        raise InputError("no training trajectories to train the gates on")
    history = train_gates(composition, examples, options.gate, on_log=on_log)
    return {"config": options.gate.model_dump(), "examples": len(examples), "final": history[-1] if history else None}
