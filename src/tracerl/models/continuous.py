"""Continuous batching for the in-process sampler: one running batch of turns over many episodes.

`ContinuousSampler` keeps one KV-cache slot per live episode in preallocated tensors
(`[slots, kv_heads, capacity, head_dim]` per layer, capacity grown by doubling). Each `step()`:

1. prefills the turns added since the last step in one forward — each row only the tokens its
   slot does not hold yet (the conversation stays cached between an episode's turns; a first turn
   starts from the prompt prefix the first turns share, computed once per adapter) — and samples
   their first token;
2. runs one decode forward over every row still generating, one token each;
3. returns the turns that ended (stop token or budget). The caller lets the environment answer and
   adds the episode's next turn, which joins at the next step; `release` frees an ended episode's
   slot (the last slot moves into it, so running rows stay in slots 0..n-1 and decode reads a view).

Rows never share positions: a row's keys sit at positions 0..len-1 of its slot, its queries at its
own positions (the RoPE positions of an unpadded sequence), and a 4D attention mask lets each query
see exactly its row's earlier positions. Prefill rows are left-padded to the longest; a pad query
writes its keys past its row's end (masked until overwritten) and attends to position 0 only.

Sampling is `generation._sample_rows` with each request's own generator, one uniform per token, so
a row's tokens and log-probs are those `generation.generate` gives for the same request (up to
floating-point differences of batched kernels), whichever rows share its batch. Measured on the
tiny agent (2026-12-02): a token's logits here and in the episode played alone (lockstep, batch 1)
differ by at most 2.2e-5 (float32, other shapes and masks), and every episode was token-identical
— 16 of 16 greedy, 16 of 16 sampled at temperature 1 (whole episodes; and capped at 6 turns) and
32 of 32 capped at 3 turns (tests/models/test_engines_alone.py checks 8 of each). A token can flip
only where the greedy top two, or the sampling uniform and a CDF boundary, are that close.

The model must be a transformers ≥ 5 causal LM (or a PEFT model of one) whose attention layers call
`cache.update(keys, values, layer_idx)` and take a 4D mask as given: sdpa or eager attention
(`supports_continuous`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache

from tracerl.core.messages import Message
from tracerl.models.generation import (
    GenerationRequest,
    GenerationResult,
    LogprobsMode,
    _cache_layers,
    _forward_signature,
    _sample_rows,
    record_token,
    shared_prefix_length,
)

MIN_CAPACITY = 256
PREFILL_TOKENS = 16384  # padded tokens per prefill forward; more rows wait for the next forward


def supports_continuous(model: torch.nn.Module) -> bool:
    """Whether `model`'s attention takes a custom 4D mask and a cache object through `update`: full
    attention in every layer (one mask serves all; a sliding-window or linear-attention layer would
    be given the full mask), sdpa or eager. A composed model qualifies: its routing is per token or
    per row (`routing_weights`, one row per running turn)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    if config is None:
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []) or getattr(config, "use_sliding_window", False):
        return False
    return getattr(config, "_attn_implementation", None) in ("sdpa", "eager")


class SlotCache(Cache):
    """Preallocated per-slot KV cache. Before each forward the sampler sets where every query's keys
    are written (`write_rows`, `write_pos`) and which slots the attention reads (`read_rows`, None =
    slots 0..batch-1) up to `read_len` positions."""
    def __init__(self, slots: int, limit: int):
        super().__init__(layers=[])
        self.slots = slots
        self.limit = limit  # doubling stops here (the model's context); longer requests still fit
        self.capacity = min(MIN_CAPACITY, limit)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.write_rows = self.write_pos = self.read_rows = None
        self.read_len = 0

    def allocate(self, layers: int, like: torch.Tensor) -> None:
        """Allocate from a key tensor of shape [batch, kv_heads, length, head_dim]."""
        shape = (self.slots, like.shape[1], self.capacity, like.shape[3])
        self.keys = [like.new_zeros(shape) for _ in range(layers)]
        self.values = [like.new_zeros(shape) for _ in range(layers)]

    def ensure(self, length: int) -> None:
        if length <= self.capacity:
            return
        capacity = max(length, min(2 * self.capacity, self.limit))
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_zeros((*old.shape[:2], capacity, old.shape[3]))
                new[:, :, : self.capacity] = old
                store[i] = new
        self.capacity = capacity

    def move(self, source: int, target: int, length: int) -> None:
        for store in (self.keys, self.values):
            for t in store:
                t[target, :, :length] = t[source, :, :length]

    def write(self, slot: int, start: int, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy per-layer (keys, values) of shape [kv_heads, length, head_dim] into a slot at `start`."""
        self.ensure(start + layers[0][0].shape[1])
        for i, (k, v) in enumerate(layers):
            self.keys[i][slot, :, start:start + k.shape[1]] = k
            self.values[i][slot, :, start:start + v.shape[1]] = v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[self.write_rows, :, self.write_pos] = key_states.transpose(1, 2).to(keys.dtype)
        values[self.write_rows, :, self.write_pos] = value_states.transpose(1, 2).to(values.dtype)
        if self.read_rows is None:
            n = key_states.shape[0]
            return keys[:n, :, : self.read_len], values[:n, :, : self.read_len]
        return keys[self.read_rows, :, : self.read_len], values[self.read_rows, :, : self.read_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.read_len


@dataclass
class _Row:
    key: Hashable
    slot: int
    cached: list[int] = field(default_factory=list)  # the ids whose keys the slot holds, in order
    request: GenerationRequest | None = None
    result: GenerationResult | None = None
    new_ids: list[int] = field(default_factory=list)  # to prefill at the next step


class ContinuousSampler:
    """A running batch over one model. `add(key, request)` queues a turn of episode `key`; `step()`
    advances every turn by one token and returns `(key, result)` of those that ended;
    `release(key)` ends the episode. Requests' `past` and `keep_cache` are ignored (the slot is the cache)."""
    def __init__(self, model: torch.nn.Module, *, max_rows: int, pad_id: int = 0,
                 logprobs_mode: LogprobsMode = "raw_logprobs",
                 forward_kwargs: Callable[[list[Any]], dict[str, Any]] | None = None,
                 device: torch.device | str | None = None, min_shared_prefix: int = 32):
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"unknown logprobs_mode '{logprobs_mode}'")
        self.model = model
        self.pad_id = pad_id
        self.logprobs_mode = logprobs_mode
        self.forward_kwargs = forward_kwargs
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.cache_name, self.keep_last = _forward_signature(model)
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.bool_mask = inner.config._attn_implementation == "sdpa"
        self.layers = int(inner.config.num_hidden_layers)
        self.cache = SlotCache(max_rows, int(getattr(inner.config, "max_position_embeddings", None) or 1 << 20))
        self.cache.allocate(self.layers, self._probe_like())
        self.rows: dict[Hashable, _Row] = {}
        self.by_slot: list[_Row] = []
        self.waiting: list[_Row] = []  # turns added, not prefilled yet
        self.running: list[_Row] = []  # turns generating
        self.done: list[_Row] = []  # turns with no token budget, returned by the next step
        self.prefixes: dict[Any, tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        self.min_shared_prefix = min_shared_prefix
        self.forwards = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.done)

    def add(self, key: Hashable, request: GenerationRequest) -> None:
        if not request.prompt_ids:
            raise ValueError("empty prompt")
        row = self.rows.get(key)
        if row is None:
            if len(self.by_slot) >= self.cache.slots:
                raise RuntimeError(f"all {self.cache.slots} slots are taken")
            row = _Row(key=key, slot=len(self.by_slot))
            self.rows[key] = row
            self.by_slot.append(row)
        elif row.request is not None:
            raise RuntimeError(f"episode {key!r} already has a turn running")
        row.request, row.result = request, GenerationResult()
        (self.waiting if request.max_new_tokens > 0 else self.done).append(row)

    def release(self, key: Hashable) -> None:
        row = self.rows.pop(key)
        if row.request is not None:
            raise RuntimeError(f"episode {key!r} still has a turn running")
        last = self.by_slot.pop()
        if last is not row:
            self.cache.move(last.slot, row.slot, len(last.cached))
            last.slot = row.slot
            self.by_slot[row.slot] = last

    def step(self) -> list[tuple[Hashable, GenerationResult]]:
        was_training = self.model.training
        if was_training:  # (eval() walks every module: only when needed)
            self.model.eval()
        try:
            with torch.no_grad():
                ended, self.done = self.done, []
                if self.waiting:
                    self._start_waiting()
                    ended += self._prefill()
                if self.running:
                    ended += self._decode()
        finally:
            if was_training:
                self.model.train()
        out = []
        for row in ended:
            out.append((row.key, row.result))
            row.request = row.result = None
        return out

    # --- prefill --------------------------------------------------------------------------
    def _start_waiting(self) -> None:
        """Set each waiting row's `new_ids`: its prompt past what its slot (or a shared prefix) holds."""
        fresh = [r for r in self.waiting if not r.cached]
        self._make_prefixes(fresh)
        for row in self.waiting:
            ids = row.request.prompt_ids
            if not row.cached:
                prefix = self._prefix_for(row.request)
                if prefix is not None:
                    self.cache.write(row.slot, 0, prefix[1])
                    row.cached = list(prefix[0])
            keep = _common_prefix(row.cached, ids, limit=len(ids) - 1)  # at least one token to run
            row.cached = row.cached[:keep]
            row.new_ids = ids[keep:]

    def _make_prefixes(self, fresh: list[_Row]) -> None:
        groups: dict[Any, list[list[int]]] = {}
        for row in fresh:
            extra = row.request.extra
            if _hashable(extra) and extra not in self.prefixes:
                groups.setdefault(extra, []).append(row.request.prompt_ids)
        for extra, prompts in groups.items():
            shared = shared_prefix_length(prompts, minimum=self.min_shared_prefix)
            if not shared:
                continue
            kwargs = self.forward_kwargs([extra]) if self.forward_kwargs else {}
            ids = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, use_cache=True, **{self.cache_name: None}, **kwargs)
            self.forwards += 1
            layers = [(k[0], v[0]) for k, v in _cache_layers(getattr(out, self.cache_name))]
            self.prefixes[extra] = (list(prompts[0][:shared]), layers)

    def _prefix_for(self, request: GenerationRequest):
        if not _hashable(request.extra):
            return None
        prefix = self.prefixes.get(request.extra)
        if prefix is None or len(request.prompt_ids) <= len(prefix[0]):
            return None
        return prefix if request.prompt_ids[: len(prefix[0])] == prefix[0] else None

    def _prefill(self) -> list[_Row]:
        rows = sorted(self.waiting, key=lambda r: len(r.new_ids))
        self.waiting = []
        ended: list[_Row] = []
        while rows:
            batch = [rows.pop(0)]
            while rows and (len(batch) + 1) * len(rows[0].new_ids) <= PREFILL_TOKENS:
                batch.append(rows.pop(0))
            ended += self._prefill_batch(sorted(batch, key=lambda r: r.slot))
        return ended

    def _prefill_batch(self, rows: list[_Row]) -> list[_Row]:
        width = max(len(r.new_ids) for r in rows)
        n = len(rows)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        positions = torch.zeros((n, width), dtype=torch.long)
        write = torch.zeros((n, width), dtype=torch.long)
        for b, row in enumerate(rows):
            start, k = len(row.cached), len(row.new_ids)
            pad = width - k
            input_ids[b, pad:] = torch.tensor(row.new_ids, dtype=torch.long)
            positions[b, pad:] = torch.arange(start, start + k)
            write[b, pad:] = torch.arange(start, start + k)
            write[b, :pad] = torch.arange(start + k, start + k + pad)  # scratch past the row's end
        read_len = max(len(r.cached) + len(r.new_ids) for r in rows)
        slots = [r.slot for r in rows]
        logits = self._forward(rows, input_ids, positions, write, read_len, slots)
        for row in rows:
            row.cached += row.new_ids
            row.new_ids = []
        return self._sample(rows, logits)

    # --- decode ---------------------------------------------------------------------------
    def _decode(self) -> list[_Row]:
        rows = sorted(self.running, key=lambda r: r.slot)
        input_ids = torch.tensor([[r.result.token_ids[-1]] for r in rows], dtype=torch.long)
        positions = torch.tensor([[len(r.cached)] for r in rows], dtype=torch.long)
        read_len = int(positions.max()) + 1
        logits = self._forward(rows, input_ids, positions, positions, read_len, [r.slot for r in rows])
        for row in rows:
            row.cached.append(row.result.token_ids[-1])
        self.running = []
        return self._sample(rows, logits)

    # --- shared ---------------------------------------------------------------------------
    def _forward(self, rows, input_ids, positions, write, read_len, slots) -> torch.Tensor:
        device = self.device
        cache = self.cache
        cache.ensure(int(write.max()) + 1)
        contiguous = slots == list(range(len(slots)))
        cache.write_rows = torch.tensor(slots, dtype=torch.long, device=device).unsqueeze(1)
        cache.write_pos = write.to(device)
        cache.read_rows = None if contiguous else cache.write_rows.squeeze(1)
        cache.read_len = read_len
        positions = positions.to(device)
        allowed = torch.arange(read_len, device=device).view(1, 1, -1) <= positions.unsqueeze(-1)
        if self.bool_mask:
            mask = allowed.unsqueeze(1)
        else:
            dtype = next(self.model.parameters()).dtype
            mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min).unsqueeze(1)
        kwargs = self.forward_kwargs([r.request.extra for r in rows]) if self.forward_kwargs else {}
        if self.keep_last:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids.to(device), attention_mask=mask, position_ids=positions,
                         use_cache=True, **{self.cache_name: cache}, **kwargs)
        self.forwards += 1
        return out.logits[:, -1, :].float()

    def _probe_like(self) -> torch.Tensor:
        """A zero key tensor of the model's KV shape, from its config."""
        inner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        config = inner.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = next(self.model.parameters()).dtype
        return torch.zeros((1, heads, 1, head_dim), dtype=dtype, device=self.device)

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> list[_Row]:
        sampled = _sample_rows(logits, [r.request for r in rows], self.logprobs_mode)
        ended = []
        for row, drawn in zip(rows, sampled, strict=True):
            if record_token(row.request, row.result, *drawn):
                self.running.append(row)
            else:
                ended.append(row)
        return ended


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


class PolicyTurns:
    """A `LocalPolicy`'s turns of many sessions through continuous samplers (one per backing module:
    the model, and each route). `submit(key, session)` queues the session's next turn (after the
    environment answered); `step()` returns `(key, assistant message)` of the turns that ended;
    `release(key)` when the episode is over. The records are those `LocalPolicy.act` writes."""
    def __init__(self, policy: Any, max_rows: int):
        self.policy = policy
        self.max_rows = max_rows
        self.samplers: dict[str | None, ContinuousSampler] = {}
        self.sessions: dict[Hashable, tuple[Any, str | None]] = {}
        self.ready: list[tuple[Hashable, Any]] = []

    @property
    def busy(self) -> bool:
        return bool(self.ready) or any(s.busy for s in self.samplers.values())

    @property
    def forwards(self) -> int:
        return sum(s.forwards for s in self.samplers.values())

    def submit(self, key: Hashable, session: Any) -> None:

        p = self.policy
        ids = p.chat.prepare(session)
        p._check_adapter(session.adapter)
        budget = min(p.max_new_tokens, p.max_context - len(ids))
        if budget <= 0:  # context full: an empty reply; the record says why (as `act`)
            session.info["context_overflow"] = True
            session.state.messages_recorded = len(session.messages) + 1
            self.ready.append((key, Message.assistant(content="")))
            return
        request = p._request(session, ids, budget)
        request.past, request.keep_cache = None, False
        route = request.extra if request.extra in p.routes else None
        sampler = self.samplers.get(route)
        if sampler is None:
            module = p.routes[route] if route is not None else p.model
            sampler = ContinuousSampler(module, max_rows=self.max_rows, pad_id=p.pad_id, logprobs_mode=p.logprobs_mode,
                                        forward_kwargs=p.continuous_forward_kwargs(route))
            self.samplers[route] = sampler
        self.sessions[key] = (session, route)
        sampler.add(key, request)

    def step(self) -> list[tuple[Hashable, Any]]:
        out, self.ready = self.ready, []
        for sampler in list(self.samplers.values()):
            if sampler.busy:
                for key, result in sampler.step():
                    session = self.sessions[key][0]
                    out.append((key, self.policy.chat.record(session, result.token_ids, result.logprobs).message))
        return out

    def release(self, key: Hashable) -> None:
        entry = self.sessions.pop(key, None)
        if entry is not None:
            self.samplers[entry[1]].release(key)
