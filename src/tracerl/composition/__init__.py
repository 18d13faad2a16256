"""TRACE step 4: compose capability LoRA adapters into one model.

- Token-level MoE: `compose(model, adapters, mode="moe")` puts a `GatedLoRALinear` on every adapted
  linear and a gate `Linear(hidden, N+1)` on every decoder layer (slot 0 = no adapter); only the
  gates train (`train_gates`).
- Task-level routing (Select & Adapt): `TaskRouter` — the base model as a zero-shot classifier over
  the capability descriptions; modes "router" (top-1) and "merge" (top-p weighted, low-rank), and
  `merge_adapters` to write W + Σ α·scaling·B A into a plain model.
- Artifacts: `build_composition` (what `tracerl compose` runs) writes a composed directory;
  `load_composed(path)` returns an HF causal LM with `model.tracerl_composition`.
"""

from tracerl.composition.accuracy import LabelledPrompt, routing_accuracy
from tracerl.composition.adapters import LoRAAdapter, LoRAModule, check_adapters, load_adapter
from tracerl.composition.artifact import CompositionSpec, load_composed, read_spec, save_composed
from tracerl.composition.build import ComposeOptions, build_composition
from tracerl.composition.composed import Capability, Composition, compose, composition_of, gate_parameter_count
from tracerl.composition.examples import GateExample, examples_from_trajectories
from tracerl.composition.layers import GatedLoRALinear
from tracerl.composition.merge import merge_adapters
from tracerl.composition.router import TaskRouter, route_names
from tracerl.composition.training import GateTrainingConfig, train_gates

__all__ = [
    "Capability", "ComposeOptions", "Composition", "CompositionSpec", "GateExample", "GateTrainingConfig",
    "GatedLoRALinear", "LabelledPrompt", "LoRAAdapter", "LoRAModule", "TaskRouter", "build_composition",
    "check_adapters", "compose", "composition_of", "examples_from_trajectories", "gate_parameter_count",
    "load_adapter", "load_composed", "merge_adapters", "read_spec", "route_names", "routing_accuracy",
    "save_composed", "train_gates",
]
