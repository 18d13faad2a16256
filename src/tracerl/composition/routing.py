"""Per-call routing of a composed model: forward pre-hooks installed for one call and removed after it.

The composed model is the base HF causal LM with `GatedLoRALinear`s in place of the adapted
linears; no method of the model or of its KV cache is replaced, and outside a routed call no hook
is registered, so the model computes the base model. `routed(composition, routing_weights)`
routes the calls made inside it, as PEFT's `_enable_peft_forward_hooks` does for `adapter_names`:

- a pre-hook on each decoder layer computes that layer's per-token slot weights (batch, seq, N+1)
  from its input hidden state: moe — the layer's gate picks one slot per token (top-1; slot 0 = no
  adapter), scaled by the gate probability while the gates train (Switch Transformer), so
  gradients reach them; router / merge, and moe routed at the opening — the explicit
  `routing_weights` (batch, N+1), one row per sequence, applied to every token;
- a pre-hook on each of the layer's gated linears passes those weights in (`route=`).

The hooks are removed in a `finally`, so an exception inside the call leaves none behind.
Registering and removing them costs about 9 µs each on CPU (2026-12-01, a loaded 2-core machine):
2.5 ms a call for a Qwen3-8B layout (36 layers × 7 adapted linears + 36 layers).
`ComposedModel` (what `load_composed` returns) wraps every `forward` / `generate` in `routed`,
like PEFT's `PeftModel`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tracerl.composition.layers import LayerRoute
from tracerl.core.errors import InputError

if TYPE_CHECKING:
    from tracerl.composition.composed import Composition


@dataclass
class RoutedCall:
    """What a routed call used and decided. `slots[i]`: moe, the slot of every token at layer i
    (batch, seq); `gate_logits`: with `record=True`, each layer's gate logits in call order."""

    weights: torch.Tensor | None = None
    force_slots: int | torch.Tensor | None = None
    labelled: torch.Tensor | None = None
    repeat_rows: bool = False
    slots: list[torch.Tensor] = field(default_factory=list)
    gate_logits: list[torch.Tensor] | None = None


def rms_normalised(hidden: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """h / RMS(h) per token, without parameters: the gates see the residual stream at unit scale,
    whatever a model's residual norms (0.3 in the embedded agent, hundreds in large models)."""
    return hidden * torch.rsqrt(hidden.pow(2).mean(dim=-1, keepdim=True) + eps)


def gate_weights(gate: nn.Linear, hidden: torch.Tensor, call: RoutedCall, index: int) -> torch.Tensor:
    """moe: the one-hot slot of each token (batch, seq, N+1) at layer `index`, as `hidden`'s dtype."""
    logits = gate(rms_normalised(hidden.to(gate.weight.dtype)))
    if call.gate_logits is not None:
        call.gate_logits.append(logits)
    if call.force_slots is None:
        slots = logits.argmax(dim=-1)
    elif isinstance(call.force_slots, int):
        slots = torch.full(logits.shape[:-1], call.force_slots, dtype=torch.long, device=logits.device)
    else:
        slots = call.force_slots.to(logits.device)
    call.slots[index] = slots.detach()
    one_hot = torch.nn.functional.one_hot(slots, logits.shape[-1]).to(logits.dtype)
    if gate.training:  # Switch: scale the chosen expert by its probability so the gate gets gradients
        scale = logits.softmax(dim=-1).gather(-1, slots.unsqueeze(-1))
        if call.labelled is not None:  # the label loss alone trains these tokens' gates
            scale = torch.where(call.labelled.to(scale.device).unsqueeze(-1), scale.detach(), scale)
        one_hot = one_hot * scale
    return one_hot.to(hidden.dtype)


def task_weights(weights: torch.Tensor, hidden: torch.Tensor, repeat_rows: bool) -> torch.Tensor:
    """router / merge: each sequence's row of `weights` on every one of its tokens, (batch, seq, N+1)."""
    batch, seq = hidden.shape[:2]
    if weights.shape[0] != batch:
        if not (repeat_rows and batch % weights.shape[0] == 0):
            raise RuntimeError(f"routing_weights hold {weights.shape[0]} rows but the batch has {batch}")
        weights = weights.repeat_interleave(batch // weights.shape[0], dim=0)  # generate's beams / return sequences
    weights = weights.to(device=hidden.device, dtype=hidden.dtype)
    return weights[:, None, :].expand(batch, seq, weights.shape[-1])


def _route_layer(module: nn.Module, args: tuple, kwargs: dict, *, composition: Composition, call: RoutedCall,
                 index: int, route: LayerRoute) -> None:
    hidden = args[0] if args else kwargs["hidden_states"]
    if call.weights is not None:
        route.weights = task_weights(call.weights, hidden, call.repeat_rows)
    else:
        assert composition.gates is not None
        route.weights = gate_weights(composition.gates[index], hidden, call, index)


def _pass_route(module: nn.Module, args: tuple, kwargs: dict, *, route: LayerRoute) -> tuple[tuple, dict]:
    kwargs["route"] = route
    return args, kwargs


@contextmanager
def routed(composition: Composition, routing_weights: torch.Tensor | None = None, *,
           force_slots: int | torch.Tensor | None = None, record: bool = False, repeat_rows: bool = False,
           labelled: torch.Tensor | None = None) -> Iterator[RoutedCall]:
    """Route the composed model's calls inside this block (see the module docstring).

    moe: the gates route, `force_slots` (a slot, or (batch, seq) slots) overrides them, `record`
    keeps their logits; a moe composition routed at the opening takes `routing_weights` (each
    episode's slot, `Composition.weights_for`) and without them its gates route each token (how
    that slot is decided). router / merge: `routing_weights` (batch, N+1) is required; with
    `repeat_rows`, a batch that is k times as long uses each row for k consecutive sequences.
    """
    if routing_weights is None:
        if composition.mode != "moe":
            raise InputError(f"a {composition.mode} composition routes by explicit routing_weights (batch, "
                             f"{composition.num_slots}): composition.weights_for(conversations), or use ComposedPolicy")
    else:
        if composition.mode == "moe" and composition.moe_routing != "opening":
            raise InputError("a moe composition routed per token takes no routing_weights (they are for router/merge, "
                             "or moe routed at the opening)")
        if routing_weights.dim() != 2 or routing_weights.shape[1] != composition.num_slots:
            raise InputError(f"routing_weights must be (batch, {composition.num_slots}), got {tuple(routing_weights.shape)}")
        if force_slots is not None or record:
            raise InputError("force_slots and record act on the gates: they are for moe calls without routing_weights")
    layers = composition.layers
    if torch.is_grad_enabled() and any(getattr(layer, "gradient_checkpointing", False) for layer in layers):
        raise InputError("routing hooks are per call: a checkpointed layer recomputed in backward would run unrouted")
    call = RoutedCall(weights=routing_weights, force_slots=force_slots, repeat_rows=repeat_rows, labelled=labelled,
                      slots=[torch.empty(0)] * len(layers), gate_logits=[] if record else None)
    handles = []
    try:
        for index, layer in enumerate(layers):
            route = LayerRoute()
            hook = partial(_route_layer, composition=composition, call=call, index=index, route=route)
            handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
            for linear in composition.linears[index]:
                handles.append(linear.register_forward_pre_hook(partial(_pass_route, route=route), with_kwargs=True))
        yield call
    finally:
        for handle in handles:
            handle.remove()


class ComposedModel(nn.Module):
    """A composed HF causal LM whose every `forward` / `generate` call is routed (like PEFT's PeftModel).

    `forward(..., routing_weights=None, **hf_kwargs)` and `generate(...)` run the wrapped model
    inside `routed`; any other attribute is the wrapped model's (`config`, `model.layers`, …).
    Router/merge (and moe routed at the opening) `generate` without `routing_weights` routes each
    row from its prompt's first user turn (`Composition.weights_for_prompt_ids`).
    """

    def __init__(self, model: nn.Module, composition: Composition):
        super().__init__()
        self.base_model = model
        self.composition = composition

    def get_base_model(self) -> nn.Module:
        return self.base_model

    def forward(self, *args: Any, routing_weights: torch.Tensor | None = None, **kwargs: Any) -> Any:
        with routed(self.composition, routing_weights):
            return self.base_model(*args, **kwargs)

    def generate(self, input_ids: torch.Tensor | None = None, *args: Any, routing_weights: torch.Tensor | None = None,
                 **kwargs: Any) -> Any:
        if routing_weights is None and self.composition.routes_by_weights and input_ids is not None:
            mask = kwargs.get("attention_mask")
            prompts = [(row if mask is None else row[mask[i].bool()]).tolist() for i, row in enumerate(input_ids)]
            routing_weights = self.composition.weights_for_prompt_ids(prompts).to(input_ids.device)
        with routed(self.composition, routing_weights, repeat_rows=True):
            return self.base_model.generate(input_ids, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base_model":  # not yet set (during __init__ or unpickling): no recursion
                raise
            return getattr(self.base_model, name)
