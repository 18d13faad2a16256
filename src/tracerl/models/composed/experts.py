"""The gated multi-LoRA experts block of a mixture-of-experts base: its fused expert weights plus N frozen
LoRA adapters, mixed per token as `GatedLoRALinear` mixes a linear's.

A mixture-of-experts base in transformers 5 (Qwen3-MoE) holds each layer's experts as fused parameters,
`gate_up_proj` [experts, 2·intermediate, hidden] and `down_proj` [experts, hidden, intermediate]; PEFT
adapts them with `target_parameters` (one LoRA per expert: expert e's update is scaling · B[e] A[e]).
For expert e and the tokens the base's router sent to it,

    gate, up = split(x W_gu[e]ᵀ + Σ_s w_s(token) · scaling_s · (x A_gu,s[e]ᵀ) B_gu,s[e]ᵀ)
    y        = h W_d[e]ᵀ + Σ_s w_s(token) · scaling_s · (h A_d,s[e]ᵀ) B_d,s[e]ᵀ,   h = act(gate) · up

weighted by the router's top-k weights and summed over the experts a token chose — the base block's own
computation (its eager loop) with each expert's low-rank updates added, no merged weight materialised.
Called without a route (outside a routed call), the block is the base's, in its own implementation.
"""

from __future__ import annotations

import torch
from torch import nn

from tracerl.models.composed.adapters import ExpertLoRA
from tracerl.models.composed.layers import LayerRoute


class _Stack(nn.Module):
    """One fused weight's adapters stacked along the rank axis, per expert (as `GatedLoRALinear` stacks a linear's)."""

    def __init__(self, adapters: dict[int, ExpertLoRA], like: torch.Tensor):
        super().__init__()
        slots = sorted(adapters)
        A = torch.cat([adapters[s].A for s in slots], dim=1)  # (experts, Σr, in)
        B = torch.cat([adapters[s].B for s in slots], dim=2)  # (experts, out, Σr)
        self.lora_A = nn.Parameter(A.to(device=like.device, dtype=like.dtype).clone(), requires_grad=False)
        self.lora_B = nn.Parameter(B.to(device=like.device, dtype=like.dtype).clone(), requires_grad=False)
        columns = [(s, adapters[s].scaling) for s in slots for _ in range(adapters[s].A.shape[1])]
        self.register_buffer("column_slot", torch.tensor([c[0] for c in columns], device=like.device), persistent=False)
        self.register_buffer("column_scaling", torch.tensor([c[1] for c in columns], dtype=torch.float32,
                                                            device=like.device), persistent=False)

    def delta(self, expert: int, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Σ_s w_s · scaling_s · (x A_s[e]ᵀ) B_s[e]ᵀ for the rows of `x`, `weights` (rows, slots) theirs."""
        columns = weights.index_select(-1, self.column_slot) * self.column_scaling.to(weights.dtype)
        return ((x @ self.lora_A[expert].T) * columns.to(x.dtype)) @ self.lora_B[expert].T


class GatedLoRAExperts(nn.Module):
    """Wraps a fused experts block `base` (kept as is, frozen) with frozen LoRA adapters per fused weight, keyed
    by slot (1..N): `adapters[param_name][slot]`. See the module docstring."""

    def __init__(self, base: nn.Module, adapters: dict[str, dict[int, ExpertLoRA]]):
        super().__init__()
        self.base = base
        self.num_experts = int(base.num_experts)
        self.stacks = nn.ModuleDict({name: _Stack(by_slot, getattr(base, name)) for name, by_slot in adapters.items()})
        self.slots = sorted({s for by_slot in adapters.values() for s in by_slot})

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                route: LayerRoute | None = None) -> torch.Tensor:
        weights = None if route is None else route.weights
        if weights is None or not self.slots:
            return self.base(hidden_states, top_k_index, top_k_weights)
        weights = weights.reshape(-1, weights.shape[-1])
        if weights.shape[0] != hidden_states.shape[0]:
            raise RuntimeError(f"routing weights for {weights.shape[0]} tokens, the experts block got {hidden_states.shape[0]}")
        base = self.base
        final = torch.zeros_like(hidden_states)
        with torch.no_grad():
            mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert in hit[:, 0].tolist():
            if expert == self.num_experts:
                continue
            position, token = torch.where(mask[expert])
            x, w = hidden_states[token], weights[token]
            gate_up = nn.functional.linear(x, base.gate_up_proj[expert]) + self._delta("gate_up_proj", expert, x, w)
            gate, up = gate_up.chunk(2, dim=-1)
            h = base.act_fn(gate) * up
            out = nn.functional.linear(h, base.down_proj[expert]) + self._delta("down_proj", expert, h, w)
            out = out * top_k_weights[token, position, None]
            final.index_add_(0, token, out.to(final.dtype))
        return final

    def _delta(self, name: str, expert: int, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor | float:
        stack = self.stacks[name] if name in self.stacks else None
        return 0.0 if stack is None else stack.delta(expert, x, weights)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, adapted {sorted(self.stacks)}, slots {self.slots}"
