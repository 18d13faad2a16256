"""Gate objectives and routing statistics over one layer's gate logits (…, S) and a token mask (…).

S = N + 1 slots (slot 0 = no adapter). Only tokens where `mask` is true count.

- `load_balancing_loss`: Switch Transformer (Fedus et al. 2021, eq. 4), S · Σ_i f_i · P_i, with
  f_i the fraction of tokens whose top-1 slot is i and P_i the mean gate probability of slot i.
  Equals 1 when routing is uniform; S when every token goes to one slot with probability 1.
- `label_loss`: cross-entropy of every token's gate distribution toward its sequence's slot.
- `routing_entropy`: mean entropy (nats) of the tokens' gate distributions.
- `expert_load`: f_i, the fraction of tokens routed to each slot.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _masked(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    flat = logits.reshape(-1, logits.shape[-1])
    keep = mask.reshape(-1).bool()
    if not keep.any():
        raise ValueError("the mask selects no tokens")
    return flat[keep]


def load_balancing_loss(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    tokens = _masked(logits, mask).float()
    num_slots = tokens.shape[-1]
    probs = tokens.softmax(dim=-1)
    fraction = F.one_hot(tokens.argmax(dim=-1), num_slots).float().mean(dim=0)
    return num_slots * (fraction * probs.mean(dim=0)).sum()


def label_loss(logits: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`slots` (batch,) is each sequence's target slot; `logits` (batch, seq, S); `mask` (batch, seq)."""
    targets = slots[:, None].expand(logits.shape[:2])
    return F.cross_entropy(_masked(logits, mask).float(), targets.reshape(-1)[mask.reshape(-1).bool()])


def routing_entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    log_probs = _masked(logits, mask).float().log_softmax(dim=-1)
    return -(log_probs.exp() * log_probs).sum(dim=-1).mean()


def expert_load(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    tokens = _masked(logits, mask)
    return F.one_hot(tokens.argmax(dim=-1), tokens.shape[-1]).float().mean(dim=0)
