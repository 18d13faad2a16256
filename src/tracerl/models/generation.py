"""Batched sampling with a KV cache over any Hugging Face-style causal LM, one set of parameters per row.

`generate(model, requests)` runs the prompt prefix that all rows share once (batch 1, its KV
cache repeated for the rows — rows of one adapter only), left-pads the rest of the prompts, runs
one prefill and then one forward per new token with the KV cache, and samples every row with its own temperature, top-p, token
budget, stop tokens and `torch.Generator` — so a row's tokens do not depend on which other rows
share its batch (up to floating-point differences of batched kernels). Rows that finish are
dropped from the batch and the cache. It serves one batch of requests (`LocalPolicy.act`, the
server's batches); `rollout` plays whole episodes through `tracerl.models.continuous`, whose rows
join and leave a running batch and sample through `_sample_rows` here.

The model only needs the HF causal-LM call `model(input_ids=, attention_mask=, position_ids=,
past_key_values=, use_cache=True, **extra) -> output with .logits and .past_key_values` (or, as
transformers ≥ 5.2x names it, `cache=` / `.cache`: whichever the forward signature has; a
`logits_to_keep` parameter is used when present) — any `AutoModelForCausalLM`, a
`peft.PeftModel`, or a composed model that mimics them. The cache object must be a
transformers `Cache` (it needs `batch_select_indices`).

Log-probabilities (`GenerationResult.logprobs`): the convention of vLLM's `--logprobs-mode`.
- `raw_logprobs` (vLLM's default): `log_softmax(logits)[token]` of the model's unmodified logits,
  whatever the temperature and top-p. Equal to the sampling distribution's log-prob only at
  temperature 1 and top-p 1.
- `processed_logprobs`: the log-prob under the distribution actually sampled from —
  `log_softmax(top_p_filter(logits / T))[token]` (T = 0, greedy: the raw log-softmax).
A GRPO trainer that scores tokens with `log_softmax(logits / T)` (as TRL does) gets ratios of
exactly 1 at the first step with `processed_logprobs` and top-p 1, at any T; with
`raw_logprobs` only at T = 1. Pair the local backend and `vllm serve --logprobs-mode …` on the
same mode.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from transformers import DynamicCache

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop_ids: Sequence[int] = ()
    generator: torch.Generator | None = None
    extra: Any = None  # routing key for `forward_kwargs` (e.g. an adapter name)
    top_logprobs: int = 0  # also return the k most likely tokens per step (OpenAI `logprobs=k`)
    past: PastKV | None = None  # a KV cache of prompt_ids[:past.length] from an earlier call (this row's)
    keep_cache: bool = False  # return the row's KV cache in `GenerationResult.past`


@dataclass
class GenerationResult:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: Literal["stop", "length"] = "length"
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    past: PastKV | None = None  # with keep_cache: the KV of prompt_ids + token_ids[:-1]


def generate(
    model: torch.nn.Module,
    requests: list[GenerationRequest],
    *,
    pad_id: int = 0,
    logprobs_mode: LogprobsMode = "raw_logprobs",
    forward_kwargs: Callable[[list[Any]], dict[str, Any]] | None = None,
    device: torch.device | str | None = None,
) -> list[GenerationResult]:
    """Sample a continuation for every request in one batch. `forward_kwargs(extras)` adds per-batch
    keyword arguments to each forward call (e.g. PEFT's `adapter_names`) for the rows still running."""
    if not requests:
        return []
    if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
        raise ValueError(f"unknown logprobs_mode '{logprobs_mode}'")
    device = torch.device(device) if device is not None else _device_of(model)
    results = [GenerationResult() for _ in requests]
    alive = [i for i, r in enumerate(requests) if r.max_new_tokens > 0]
    if not alive:
        return results
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            _run(model, requests, results, alive, pad_id, logprobs_mode, forward_kwargs, device)
    finally:
        model.train(was_training)
    return results


def _run(model, requests, results, alive, pad_id, logprobs_mode, forward_kwargs, device) -> None:
    prompts = [requests[i].prompt_ids for i in alive]
    if any(not p for p in prompts):
        raise ValueError("empty prompt")
    for i in alive:
        past = requests[i].past
        if past is not None and not 0 < past.length < len(requests[i].prompt_ids):
            raise ValueError("a past KV cache must cover a proper prefix of the prompt")
    cache_name, keep_last = _forward_signature(model)
    cache = None
    context = 0  # cache positions before the new prompt tokens (shared prefix or reused KV)
    context_mask = None
    pasts = [requests[i].past for i in alive]
    extras = [requests[i].extra for i in alive]
    if any(p is not None for p in pasts):  # each row continues its own earlier KV cache
        cache, context_mask = _stack_pasts(pasts, device)
        context = context_mask.shape[1]
        prompts = [p[past.length:] if past is not None else p for p, past in zip(prompts, pasts, strict=True)]
    elif all(e == extras[0] for e in extras) and (shared := shared_prefix_length(prompts)):
        # one forward for the prompt prefix all rows share (system prompt, a GRPO group's prompt)
        extra = forward_kwargs([extras[0]]) if forward_kwargs else {}
        prefix = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=device)
        out = model(input_ids=prefix, use_cache=True, **{cache_name: None}, **extra)
        cache = getattr(out, cache_name)
        cache.batch_repeat_interleave(len(alive))
        context = shared
        context_mask = torch.ones((len(alive), shared), dtype=torch.long, device=device)
        prompts = [p[shared:] for p in prompts]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(alive), width), pad_id, dtype=torch.long)
    new_mask = torch.zeros((len(alive), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        new_mask[row, width - len(prompt):] = 1
    input_ids, new_mask = input_ids.to(device), new_mask.to(device)
    attention = new_mask if context_mask is None else torch.cat([context_mask, new_mask], dim=1)
    step_positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, context:]
    step_input = input_ids
    while alive:
        extra = forward_kwargs([requests[i].extra for i in alive]) if forward_kwargs else {}
        if keep_last:
            extra["logits_to_keep"] = 1
        out = model(
            input_ids=step_input,
            attention_mask=attention,
            position_ids=step_positions,
            use_cache=True,
            **{cache_name: cache},
            **extra,
        )
        cache = getattr(out, cache_name)
        logits = out.logits[:, -1, :].float()
        tokens = []
        keep = []
        sampled = _sample_rows(logits, [requests[i] for i in alive], logprobs_mode)
        for row, i in enumerate(alive):
            if record_token(requests[i], results[i], *sampled[row]):
                keep.append(row)
                tokens.append(sampled[row][0])
                continue
            if requests[i].keep_cache:  # the KV of prompt + generated[:-1], for the row's next turn
                results[i].past = _row_past(cache, row, attention[row])
        if not keep:
            break
        next_tokens = torch.tensor(tokens, dtype=torch.long, device=device).unsqueeze(1)
        if len(keep) < len(alive):
            index = torch.tensor(keep, dtype=torch.long, device=device)
            cache.batch_select_indices(index)
            attention = attention.index_select(0, index)
            step_positions = step_positions.index_select(0, index)
            alive = [alive[r] for r in keep]
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        step_positions = step_positions[:, -1:] + 1
        step_input = next_tokens


@dataclass
class PastKV:
    """One row's KV cache: per layer (keys, values) of shape [kv_heads, length, head_dim], covering
    the first `length` tokens of the sequence it was computed on."""
    length: int
    layers: list[tuple[torch.Tensor, torch.Tensor]]


def _cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 5


def _row_past(cache: Any, row: int, mask_row: torch.Tensor) -> PastKV:
    index = mask_row.nonzero().squeeze(-1)
    layers = []
    for keys, values in _cache_layers(cache):
        layers.append((keys[row].index_select(1, index), values[row].index_select(1, index)))
    return PastKV(length=int(index.numel()), layers=layers)


def _stack_pasts(pasts: list[PastKV | None], device: torch.device) -> tuple[Any, torch.Tensor]:
    """A batch cache from per-row caches, left-padded (mask 0) to the longest; rows without one are all padding."""
    reference = next(p for p in pasts if p is not None)
    longest = max(p.length for p in pasts if p is not None)
    mask = torch.zeros((len(pasts), longest), dtype=torch.long, device=device)
    cache = DynamicCache()
    for layer, (k_ref, v_ref) in enumerate(reference.layers):
        keys = k_ref.new_zeros((len(pasts), k_ref.shape[0], longest, k_ref.shape[2]))
        values = v_ref.new_zeros((len(pasts), v_ref.shape[0], longest, v_ref.shape[2]))
        for row, past in enumerate(pasts):
            if past is None:
                continue
            keys[row, :, longest - past.length:] = past.layers[layer][0]
            values[row, :, longest - past.length:] = past.layers[layer][1]
            mask[row, longest - past.length:] = 1
        cache.update(keys, values, layer)
    return cache, mask


def shared_prefix_length(prompts: list[list[int]], minimum: int = 32) -> int:
    """Length of the prefix all prompts share, leaving each at least one token; 0 if under `minimum`
    or for a single prompt (nothing to share)."""
    if len(prompts) < 2:
        return 0
    first = prompts[0]
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        k = 0
        while k < n and p[k] == first[k]:
            k += 1
        n = k
    return n if n >= minimum else 0


def record_token(req: GenerationRequest, res: GenerationResult, token: int, logprob: float, top: Any) -> bool:
    """Append a sampled token to a request's result; set its finish reason and return False when the
    turn ends (a stop token, or `max_new_tokens` reached)."""
    res.token_ids.append(token)
    res.logprobs.append(logprob)
    if req.top_logprobs:
        res.top_logprobs.append(top)
    if token in req.stop_ids:
        res.finish_reason = "stop"
    elif len(res.token_ids) >= req.max_new_tokens:
        res.finish_reason = "length"
    else:
        return True
    return False


def _sample_rows(logits: torch.Tensor, reqs: list[GenerationRequest], mode: LogprobsMode) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """Sample one token per row, vectorised: each row draws one uniform number from its own
    generator and takes the inverse CDF of its (temperature, top-p) distribution; temperature 0 rows
    take the argmax. Returns (token, log-prob under `mode`, top log-probs) per row."""
    raw = F.log_softmax(logits, dim=-1)
    temperatures = torch.tensor([r.temperature for r in reqs], dtype=logits.dtype, device=logits.device)
    sampling = temperatures > 0
    tokens = torch.argmax(logits, dim=-1)
    processed = raw
    if bool(sampling.any()):
        scaled = logits / torch.where(sampling, temperatures, torch.ones_like(temperatures)).unsqueeze(1)
        for row, r in enumerate(reqs):
            if r.temperature > 0 and r.top_p < 1.0:
                scaled[row] = top_p_filter(scaled[row], r.top_p)
        processed = torch.where(sampling.unsqueeze(1), F.log_softmax(scaled, dim=-1), raw)
        uniforms = torch.stack([torch.rand((), generator=r.generator, device=logits.device) for r in reqs])
        cdf = processed.exp().cumsum(dim=-1)
        target = (uniforms * cdf[:, -1]).clamp(min=torch.finfo(cdf.dtype).tiny)  # never a zero-probability token
        drawn = torch.searchsorted(cdf, target.unsqueeze(1)).squeeze(1)
        drawn = drawn.clamp(max=logits.shape[-1] - 1)
        tokens = torch.where(sampling, drawn, tokens)
    dist = raw if mode == "raw_logprobs" else processed
    chosen = dist.gather(1, tokens.unsqueeze(1)).squeeze(1)
    out = []
    for row, (token, logprob) in enumerate(zip(tokens.tolist(), chosen.tolist(), strict=True)):
        k = reqs[row].top_logprobs
        top: list[tuple[int, float]] = []
        if k:
            values, ids = torch.topk(dist[row], min(k, dist.shape[-1]))
            top = [(int(t), float(v)) for t, v in zip(ids.tolist(), values.tolist(), strict=True)]
        out.append((int(token), float(logprob), top))
    return out


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches `top_p`; -inf elsewhere.

    The most likely token is always kept. Ties at the boundary are cut by sort order.
    """
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = F.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(-1) - probs  # mass of the strictly more likely tokens
    drop_sorted = before >= top_p
    drop_sorted[0] = False
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _forward_signature(model: torch.nn.Module) -> tuple[str, bool]:
    """Which keyword carries the KV cache ("cache" in transformers ≥ 5.2x, else "past_key_values"),
    and whether the forward takes `logits_to_keep` (then the prefill computes only the last logits)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(inner.forward).parameters
    cache_name = "cache" if "cache" in params else "past_key_values"
    return cache_name, "logits_to_keep" in params


def _device_of(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")
