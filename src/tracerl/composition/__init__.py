"""TRACE step 4: compose capability LoRA adapters into one model.

- Token-level MoE: `compose(model, adapters, mode="moe")` puts a `GatedLoRALinear` on every adapted
  linear and a gate `Linear(hidden, N+1)` on every decoder layer (slot 0 = no adapter); only the
  gates train (`train_gates`).
- Task-level routing (Select & Adapt): `TaskRouter` — the base model as a zero-shot classifier over
  the capability descriptions; modes "router" (top-1) and "merge" (top-p weighted, low-rank), and
  `merge_adapters` to write W + Σ α·scaling·B A into a plain model.
- Artifacts: `build_composition` (what `tracerl compose` runs) writes a composed directory;
  `load_composed(path)` returns a `ComposedModel`: an HF causal LM that routes every call through
  forward pre-hooks installed for that call and removed after it (`tracerl.composition.routing`).
"""

_EXPORTS = {
    "LabelledPrompt": "tracerl.composition.accuracy", "routing_accuracy": "tracerl.composition.accuracy",
    "LoRAAdapter": "tracerl.composition.adapters", "LoRAModule": "tracerl.composition.adapters",
    "check_adapters": "tracerl.composition.adapters", "load_adapter": "tracerl.composition.adapters",
    "CompositionSpec": "tracerl.contracts", "load_composed": "tracerl.composition.artifact",
    "read_spec": "tracerl.composition.artifact", "save_composed": "tracerl.composition.artifact",
    "ComposeOptions": "tracerl.composition.build", "build_composition": "tracerl.composition.build",
    "Capability": "tracerl.contracts", "Composition": "tracerl.composition.composed",
    "compose": "tracerl.composition.composed", "composition_of": "tracerl.composition.composed",
    "gate_parameter_count": "tracerl.composition.composed", "GateExample": "tracerl.composition.examples",
    "examples_from_trajectories": "tracerl.composition.examples", "GatedLoRALinear": "tracerl.composition.layers",
    "merge_adapters": "tracerl.composition.merge", "ComposedModel": "tracerl.composition.routing", "TaskRouter": "tracerl.composition.router",
    "route_names": "tracerl.composition.router", "GateTrainingConfig": "tracerl.composition.training",
    "train_gates": "tracerl.composition.training",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):  # lazy: `tracerl --help` and the commands that load no model need not import torch
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
