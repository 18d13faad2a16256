"""The GRPO objective over padded token tables: log-probs, clipped surrogate, KL, normalisations.

All tables are [batch, time]; `mask` is 1 on tokens the model generated (these take loss). Per token

    ρ = exp(logp − old_logp)                                  (old_logp: the sampler's log-prob)
    l = −min(ρ·A, clip(ρ, 1 − ε, 1 + ε_high)·A) + β·(exp(ref − logp) − (ref − logp) − 1)

and the loss normalisations are TRL's (B sequences, L = max_completion_length):

    grpo     mean over sequences of (Σ_t l·m / Σ_t m)
    dapo     Σ l·m / (tokens in the whole batch)
    dr_grpo  Σ l·m / (B · L)

`policy_loss` returns one micro-batch's *share* of the whole-batch loss (it divides by whole-batch
counts), so summing the shares of every micro-batch on every rank gives exactly TRL's loss on the
full batch — gradient accumulation and data parallelism do not change the result.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tracerl.models.generation import _forward_signature

LOGITS_CHUNK_ELEMENTS = 1 << 27  # tokens × vocabulary entries whose logits exist at once (512 MiB in float32)


def token_logprobs(
    model: torch.nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0,
    prefix_len: int = 0, *, entropy: bool = True, chunk_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of every token given its prefix, and the entropy of that position's distribution.

    Both [batch, time], aligned with `ids` (position 0 has no prefix: 0). Logits are divided by
    `temperature` so that the log-probs are those of the distribution the sampler drew from.
    `entropy=False` skips the entropy (returned as None): only the loss's forward logs it.

    `prefix_len` > 0: every row starts with the same `prefix_len` tokens, none of which is scored
    (context). The prefix then runs once, with batch size 1, its KV cache is repeated for the rows
    and the rest runs on top of it — the same values and gradients for a fraction of the compute
    (the rows of a GRPO group share their whole prompt). Positions 1…prefix_len−1 come back as 0.

    Memory: while the scored tokens × vocabulary fit in `chunk_elements` (None: `LOGITS_CHUNK_ELEMENTS`,
    read at the call), the model's logits are
    taken whole, as `model(...).logits`. Beyond that (Qwen3's 151,936-entry vocabulary: 883 tokens)
    the model runs with its output head set aside, and the head, the float32 log-softmax and the
    entropy run over chunks of `chunk_elements // vocabulary` tokens, each recomputed in backward
    (`torch.utils.checkpoint`): the whole-vocabulary distribution never exists for more than one
    chunk, in training or not (TRL's selective log-softmax, fused with the head as Liger's
    linear cross-entropy is). The values are the same up to float rounding.
    """
    chunk_elements = LOGITS_CHUNK_ELEMENTS if chunk_elements is None else chunk_elements
    head = _chunkable_head(model)
    rows, width = ids.shape
    scored = (width - 1) if prefix_len <= 0 else (width - prefix_len)
    vocab = head.out_features if head is not None else None
    chunked = head is not None and rows * scored * vocab > chunk_elements
    with _hidden_states_out(head) if chunked else nullcontext():
        if prefix_len <= 0:
            out = model(input_ids=ids, attention_mask=attention_mask).logits[:, :-1]
            targets, pad = ids[:, 1:], 1
        else:
            if not 0 < prefix_len < width:
                raise ValueError("prefix_len must leave at least one token per row")
            cache_name, _ = _forward_signature(model)  # "cache" in recent transformers, else "past_key_values"
            first = model(input_ids=ids[:1, :prefix_len], use_cache=True)
            cache = getattr(first, cache_name)
            cache.batch_repeat_interleave(rows)
            positions = torch.arange(prefix_len, width, device=ids.device).expand(rows, -1)
            tail = model(input_ids=ids[:, prefix_len:], attention_mask=attention_mask, position_ids=positions,
                         use_cache=True, **{cache_name: cache}).logits
            # predicting tokens prefix_len … width−1: the prefix's last position, then the tail's
            out = torch.cat([first.logits[:, -1:].expand(rows, -1, -1), tail[:, :-1]], dim=1)
            targets, pad = ids[:, prefix_len:], prefix_len
    if chunked:
        logp, ent = _chunked_scores(out, head.weight, head.bias, targets, temperature, entropy,
                                    max(1, chunk_elements // vocab))
    else:
        logp, ent = _scored(out, targets, temperature, entropy)
    zeros = logp.new_zeros(rows, pad)
    return torch.cat([zeros, logp], dim=1), torch.cat([zeros, ent], dim=1) if ent is not None else None


def _scored(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
            entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else None
    return logp, ent


def _chunkable_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output head when the logits can be taken apart from the model's forward: a plain
    linear (no LoRA on it) with nothing after it (no logit soft-capping); else None (logits whole)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    config = getattr(model, "config", None)
    if type(head) is not torch.nn.Linear or getattr(config, "final_logit_softcapping", None) is not None:
        return None
    return head


@contextmanager
def _hidden_states_out(head: torch.nn.Linear) -> Iterator[None]:
    """Inside, `head` passes its input through: the model's `.logits` are its final hidden states."""
    head.forward = _identity
    try:
        yield
    finally:
        del head.forward


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _chunked_scores(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                    temperature: float, entropy: bool, chunk: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_scored(F.linear(hidden, weight, bias), …)` over chunks of `chunk` tokens, each chunk's logits
    recomputed in backward rather than kept."""
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = targets.reshape(-1)
    logps, ents = [], []
    for start in range(0, flat_h.shape[0], chunk):
        h, t = flat_h[start:start + chunk], flat_t[start:start + chunk]
        if torch.is_grad_enabled() and h.requires_grad:
            logp, ent = checkpoint(_chunk_scores, h, t, weight, bias, temperature, entropy, use_reentrant=False)
        else:
            logp, ent = _chunk_scores(h, t, weight, bias, temperature, entropy)
        logps.append(logp)
        ents.append(ent)
    logp = torch.cat(logps).view(targets.shape)
    return logp, torch.cat(ents).view(targets.shape) if entropy else None


def _chunk_scores(h: torch.Tensor, t: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  temperature: float, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logp_all = F.log_softmax(F.linear(h, weight, bias).float() / temperature, dim=-1)
    logp = logp_all.gather(-1, t[:, None]).squeeze(-1)
    if not entropy:
        return logp, None
    with torch.no_grad():  # logged only
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


def shared_prefix_length(ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> int:
    """Leading columns that every row shares, attends to and does not score — at most (shortest row − 1)."""
    shared = (ids == ids[:1]).all(dim=0) & attention_mask.bool().all(dim=0) & ~loss_mask.bool().any(dim=0)
    n = int(torch.cumprod(shared.long(), dim=0).sum())
    shortest = int(attention_mask.sum(dim=1).min())
    return max(0, min(n, shortest - 1))


@dataclass(frozen=True)
class BatchCounts:
    """Whole-batch sizes (all micro-batches, all ranks) that the loss normalisations divide by."""
    sequences: int
    tokens: int


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    counts: BatchCounts,
    *,
    loss_type: str = "grpo",
    epsilon: float = 0.2,
    epsilon_high: float = 0.28,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    max_completion_length: int = 256,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the clipped-surrogate loss, and summed statistics for logging.

    The statistics are sums over masked tokens (`clipped`, `kl`, `approx_kl`, `tokens`), to be
    added over micro-batches and ranks and divided by the token count at the end.
    """
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype)[:, None]
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)
    kl = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs the base model's log-probs (ref_logp)")
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + beta * kl
    summed = (per_token * mask).sum(-1)
    if loss_type == "grpo":
        loss = (summed / mask.sum(-1).clamp(min=1.0)).sum() / counts.sequences
    elif loss_type == "dapo":
        loss = summed.sum() / max(counts.tokens, 1)
    elif loss_type == "dr_grpo":
        loss = summed.sum() / (counts.sequences * max_completion_length)
    else:
        raise ValueError(f"loss_type must be grpo, dapo or dr_grpo, not {loss_type!r}")
    with torch.no_grad():
        is_clipped = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
        stats = {
            "tokens": mask.sum(),
            "clipped": (is_clipped.to(mask.dtype) * mask).sum(),
            # k3 estimate of KL(sampler ‖ current) from the sampler's tokens
            "approx_kl": ((ratio - 1 - log_ratio) * mask).sum(),
            "kl": (kl * mask).sum() if kl is not None else mask.new_zeros(()),
        }
    return loss, stats
