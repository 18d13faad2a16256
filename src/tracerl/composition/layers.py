"""The gated multi-LoRA linear layer: a frozen base linear plus N frozen LoRA experts, mixed per token.

    y = W x + Σ_{s=1..N} w_s(token) · scaling_s · B_s (A_s x)

`w(token)` is a vector over the slots 0..N (slot 0 = "no adapter", it adds nothing), set for every
token by the decoder layer's router before the layer runs (`LayerRoute.weights`, shape
(batch, seq, N+1)). Token-level MoE sets a one-hot row (times the gate probability while the gates
train); task-level routing sets one row per sequence (one-hot for top-1, α for a weighted merge).

Only low-rank products are computed, and only for the tokens whose weight for that expert is
non-zero: no merged weight matrix is ever materialised, so one batch can mix experts freely.
"""

from __future__ import annotations

import torch
from torch import nn

from tracerl.composition.adapters import LoRAModule


class LayerRoute:
    """The per-token slot weights of one decoder layer, shared by all its gated linears."""

    def __init__(self) -> None:
        self.weights: torch.Tensor | None = None  # (batch, seq, num_slots); None = base model only


class GatedLoRALinear(nn.Module):
    """Wraps `base` (kept as is, frozen) with frozen LoRA experts keyed by slot (1..N)."""

    def __init__(self, base: nn.Linear, experts: dict[int, LoRAModule], route: LayerRoute):
        super().__init__()
        self.base = base
        self.route = route
        self.slots = sorted(experts)
        self.scaling = {s: experts[s].scaling for s in self.slots}
        dtype, device = base.weight.dtype, base.weight.device
        self.lora_A = nn.ParameterDict(
            {str(s): nn.Parameter(experts[s].A.to(device=device, dtype=dtype).clone(), requires_grad=False) for s in self.slots}
        )
        self.lora_B = nn.ParameterDict(
            {str(s): nn.Parameter(experts[s].B.to(device=device, dtype=dtype).clone(), requires_grad=False) for s in self.slots}
        )

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        weights = self.route.weights
        if weights is None or not self.slots:
            return y
        if weights.shape[:-1] != x.shape[:-1]:
            raise RuntimeError(f"routing weights {tuple(weights.shape)} do not match the layer input {tuple(x.shape)}")
        flat_x = x.reshape(-1, x.shape[-1])
        flat_w = weights.reshape(-1, weights.shape[-1])
        flat_y = y.reshape(-1, y.shape[-1])
        for s in self.slots:
            column = flat_w[:, s]
            rows = column.nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            xs = flat_x.index_select(0, rows)
            delta = (xs @ self.lora_A[str(s)].T) @ self.lora_B[str(s)].T
            delta = delta * (self.scaling[s] * column.index_select(0, rows)).unsqueeze(1).to(delta.dtype)
            flat_y = flat_y.index_add(0, rows, delta.to(flat_y.dtype))
        return flat_y.view_as(y)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, experts at slots {self.slots}"
