"""The gated multi-LoRA linear layer: a frozen base linear plus N frozen LoRA experts, mixed per token.

    y = W x + Σ_{s=1..N} w_s(token) · scaling_s · B_s (A_s x)

`w(token)` is a vector over the slots 0..N (slot 0 = "no adapter", it adds nothing). The weights
arrive as an argument, `forward(x, route=LayerRoute)`, which the composition's per-call routing
hooks pass in (`tracerl.models.composed.composition.routed`); called without one, the layer is its base linear.
Token-level MoE sets a one-hot row (times the gate probability while the gates train);
task-level routing sets one row per sequence (one-hot for top-1, α for a weighted merge).

Only low-rank products are computed — no merged weight matrix is ever materialised — so one
batch can mix experts freely.
"""

from __future__ import annotations

import torch
from torch import nn

from tracerl.models.composed.adapters import LoRAModule


class LayerRoute:
    """The per-token slot weights of one decoder layer in one forward call, passed to all its gated linears.

    `weights` is (batch, seq, num_slots), or None for the base model only. Linears with the same
    expert layout (usually all of a layer's) share one computation of their rank-column weights.
    """

    def __init__(self) -> None:
        self._weights: torch.Tensor | None = None
        self._columns: dict[tuple, torch.Tensor] = {}

    @property
    def weights(self) -> torch.Tensor | None:
        return self._weights

    @weights.setter
    def weights(self, value: torch.Tensor | None) -> None:
        self._weights = value
        self._columns = {}

    def column_weights(self, layout: tuple, column_slot: torch.Tensor, column_scaling: torch.Tensor) -> torch.Tensor:
        """weights[..., column_slot] · column_scaling: each rank column's weight per token."""
        cached = self._columns.get(layout)
        if cached is None:
            assert self._weights is not None
            cached = self._weights.index_select(-1, column_slot) * column_scaling.to(self._weights.dtype)
            self._columns[layout] = cached
        return cached


class GatedLoRALinear(nn.Module):
    """Wraps `base` (kept as is, frozen) with frozen LoRA experts keyed by slot (1..N).

    The experts' factors are stacked along the rank axis: `lora_A` (Σr, in), `lora_B` (out, Σr),
    `column_slot[j]` the slot of rank column j and `column_scaling[j]` its LoRA scaling. Two ways
    to apply them, same result:

    - "dense" (default): `((x A_catᵀ) ⊙ w[:, column_slot] · column_scaling) B_catᵀ` — two thin
      matmuls over all experts' rank columns (Σr is small), no host synchronisation; the
      weights zero the columns of experts a token did not choose.
    - "gather": per expert, only the tokens that chose it (index_select / index_add) — fewer
      flops when Σr is large, but one host sync per expert.
    """

    strategy: str = "dense"

    def __init__(self, base: nn.Linear, experts: dict[int, LoRAModule]):
        super().__init__()
        self.base = base
        self.slots = sorted(experts)
        dtype, device = base.weight.dtype, base.weight.device
        self.ranges: dict[int, tuple[int, int]] = {}
        start = 0
        for s in self.slots:
            self.ranges[s] = (start, start + experts[s].A.shape[0])
            start += experts[s].A.shape[0]
        A = torch.cat([experts[s].A for s in self.slots]) if self.slots else torch.zeros(0, base.in_features)
        B = torch.cat([experts[s].B for s in self.slots], dim=1) if self.slots else torch.zeros(base.out_features, 0)
        self.lora_A = nn.Parameter(A.to(device=device, dtype=dtype).clone(), requires_grad=False)
        self.lora_B = nn.Parameter(B.to(device=device, dtype=dtype).clone(), requires_grad=False)
        slot_of_column = [s for s in self.slots for _ in range(*self.ranges[s])]
        scaling_of_column = [experts[s].scaling for s in self.slots for _ in range(*self.ranges[s])]
        self.register_buffer("column_slot", torch.tensor(slot_of_column, dtype=torch.long, device=device), persistent=False)
        self.register_buffer("column_scaling", torch.tensor(scaling_of_column, dtype=torch.float32, device=device), persistent=False)
        self.scaling = {s: experts[s].scaling for s in self.slots}
        self.layout = tuple((s, *self.ranges[s], self.scaling[s]) for s in self.slots)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def expert_factors(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, B) of the expert at `slot`."""
        lo, hi = self.ranges[slot]
        return self.lora_A[lo:hi], self.lora_B[:, lo:hi]

    def forward(self, x: torch.Tensor, route: LayerRoute | None = None) -> torch.Tensor:
        y = self.base(x)
        weights = None if route is None else route.weights
        if weights is None or not self.slots:
            return y
        if weights.shape[:-1] != x.shape[:-1]:
            raise RuntimeError(f"routing weights {tuple(weights.shape)} do not match the layer input {tuple(x.shape)}")
        if self.strategy == "gather":
            return self._gather(x, y, weights)
        column_weights = route.column_weights(self.layout, self.column_slot, self.column_scaling)
        low_rank = (x @ self.lora_A.T) * column_weights.to(x.dtype)
        return y + low_rank @ self.lora_B.T

    def _gather(self, x: torch.Tensor, y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        flat_x = x.reshape(-1, x.shape[-1])
        flat_w = weights.reshape(-1, weights.shape[-1])
        flat_y = y.reshape(-1, y.shape[-1])
        for s in self.slots:
            column = flat_w[:, s]
            rows = column.nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            A, B = self.expert_factors(s)
            delta = (flat_x.index_select(0, rows) @ A.T) @ B.T
            delta = delta * (self.scaling[s] * column.index_select(0, rows)).unsqueeze(1).to(delta.dtype)
            flat_y = flat_y.index_add(0, rows, delta.to(flat_y.dtype))
        return flat_y.view_as(y)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, experts at slots {self.slots}, strategy={self.strategy}"
