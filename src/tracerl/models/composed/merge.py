"""Materialise a weighted merge of LoRA adapters into a plain model: W' = W + Σ_c α_c · scaling_c · B_c A_c.

The composed model computes the same update low-rank and per sequence (`routing_weights`); this
writes it into the weights once, for a fixed α — e.g. to export one merged checkpoint that any
server (vLLM included) loads as an ordinary model. It equals PEFT's
`add_weighted_adapter(…, combination_type="cat")` followed by `merge_and_unload()`: "cat" stacks
the factors so the product is exactly the weighted sum (PEFT's "linear" mixes cross terms).
"""

from __future__ import annotations

import torch
from torch import nn

from tracerl.core.errors import InputError
from tracerl.models.composed.adapters import LoRAAdapter, check_adapters, expert_targets


@torch.no_grad()
def merge_adapters(model: nn.Module, adapters: list[LoRAAdapter], alpha: list[float], base_ref: str | None = None) -> nn.Module:
    """Add Σ α_c scaling_c B_c A_c to each targeted linear of `model`, in place; returns `model`."""
    if len(alpha) != len(adapters):
        raise InputError(f"{len(alpha)} merge weights for {len(adapters)} adapters")
    check_adapters(model, adapters, base_ref)
    deltas: dict[str, torch.Tensor] = {}  # accumulated in float64, rounded once into the weight's dtype
    for weight, adapter in zip(alpha, adapters, strict=True):
        if weight == 0:
            continue
        for name, lora in [*adapter.modules.items(), *expert_targets(model, adapter).items()]:
            delta = (float(weight) * lora.scaling) * (lora.B.double() @ lora.A.double())  # experts: batched
            deltas[name] = deltas[name] + delta if name in deltas else delta
    for name, delta in deltas.items():
        param = _weight(model, name)
        param.copy_((param.double() + delta).to(param.dtype))
    return model


def _weight(model: nn.Module, name: str) -> torch.Tensor:
    """A linear's weight by the linear's name, or a fused expert weight by its own."""
    try:
        return model.get_submodule(name).weight
    except AttributeError:
        return model.get_parameter(name)
