"""Continuous batching for the in-process sampler: one running batch of turns over many episodes.

`ContinuousSampler` keeps one KV-cache slot per live episode: by default in preallocated tensors
(`SlotCache`: `[slots, kv_heads, capacity, head_dim]` per layer, capacity grown by doubling, so every
slot has room for the longest episode), or with a token budget (`kv_cache_tokens`) in 16-token blocks
from one pool of at most that many tokens (`PagedCache`), turns waiting while it is full. Each `step()`:

1. prefills the turns added since the last step in one forward — each row only the tokens its
   slot does not hold yet (the conversation stays cached between an episode's turns; a first turn
   starts from the prompt prefix the first turns share, computed once per adapter) — and samples
   their first token;
2. runs one decode forward over every row still generating, one token each;
3. returns the turns that ended (stop token or budget). The caller lets the environment answer and
   adds the episode's next turn, which joins at the next step; `release` frees an ended episode's
   slot (the last slot moves into it, so running rows stay in slots 0..n-1 and decode reads a view of
   a `SlotCache`; a `PagedCache` gathers each forward's rows' blocks).

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

from tracerl.core.errors import InputError
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

    def set_forward(self, slots: list[int], write_pos: torch.Tensor, read_len: int) -> None:
        """Before a forward: row b of the batch is slot `slots[b]`; its queries' keys go to `write_pos[b]`
        and it reads its slot's first `read_len` positions."""
        device = self.keys[0].device
        self.ensure(int(write_pos.max()) + 1)
        contiguous = slots == list(range(len(slots)))
        self.write_rows = torch.tensor(slots, dtype=torch.long, device=device).unsqueeze(1)
        self.write_pos = write_pos.to(device)
        self.read_rows = None if contiguous else self.write_rows.squeeze(1)
        self.read_len = read_len

    def free(self, slot: int) -> None:
        """An episode left `slot` (its keys stay until overwritten)."""

    @property
    def allocated_tokens(self) -> int:
        """Token positions the key-value tensors hold room for: slots × capacity."""
        return self.slots * self.capacity if self.keys else 0

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


class PagedCache(Cache):
    """A key-value cache of `block`-token blocks from one pool per layer, at most `max_tokens` tokens in all
    (block 0 is scratch, where padding's keys go). A slot (an episode) holds the blocks of its positions
    (`tables[slot]`); the pool grows by doubling up to the bound, and a forward gathers its rows' blocks
    into one [rows, kv_heads, read_len, head_dim] view per layer (a block is [block, kv_heads, head_dim], so
    the gather is one copy). The sampler admits a turn only when
    the blocks it may need are free (`ContinuousSampler`), so a forward never runs out."""

    def __init__(self, max_tokens: int, limit: int, block: int = 16):
        super().__init__(layers=[])
        self.block = block
        self.max_blocks = max(1, max_tokens // block)
        self.limit = limit
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.tables: dict[int, list[int]] = {}
        self.free_blocks: list[int] = []
        self.peak_blocks = 0
        self.read_index = self.write_block = self.write_offset = None
        self.read_len = 0

    @property
    def blocks(self) -> int:  # allocated, scratch block included
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def allocated_tokens(self) -> int:
        return self.blocks * self.block

    def used_blocks(self) -> int:
        return sum(len(t) for t in self.tables.values())

    def allocate(self, layers: int, like: torch.Tensor) -> None:
        shape = (1 + min(self.max_blocks, 16), self.block, like.shape[1], like.shape[3])
        self.keys = [like.new_zeros(shape) for _ in range(layers)]
        self.values = [like.new_zeros(shape) for _ in range(layers)]
        self.free_blocks = list(range(shape[0] - 1, 0, -1))

    def _grow(self) -> None:
        old = self.blocks
        new = 1 + min(self.max_blocks, 2 * (old - 1))
        if new <= old:
            raise RuntimeError(f"the key-value cache is full ({self.max_blocks} blocks of {self.block} tokens)")
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                grown = t.new_zeros((new, *t.shape[1:]))
                grown[:old] = t
                store[i] = grown
        self.free_blocks = list(range(new - 1, old - 1, -1)) + self.free_blocks

    def reserve(self, slot: int, length: int) -> None:
        """Blocks for positions 0..length-1 of `slot`."""
        table = self.tables.setdefault(slot, [])
        while len(table) * self.block < length:
            if not self.free_blocks:
                self._grow()
            table.append(self.free_blocks.pop())
        self.peak_blocks = max(self.peak_blocks, self.used_blocks())

    def free(self, slot: int) -> None:
        self.free_blocks += reversed(self.tables.pop(slot, []))

    def move(self, source: int, target: int, length: int) -> None:
        self.free(target)
        if source in self.tables:
            self.tables[target] = self.tables.pop(source)

    def write(self, slot: int, start: int, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        length = layers[0][0].shape[1]
        self.reserve(slot, start + length)
        pos = torch.arange(start, start + length)
        index = torch.tensor(self.tables[slot], dtype=torch.long)[pos // self.block]
        offset = pos % self.block
        for i, (k, v) in enumerate(layers):
            device = self.keys[i].device
            self.keys[i][index.to(device), offset.to(device)] = k.transpose(0, 1)
            self.values[i][index.to(device), offset.to(device)] = v.transpose(0, 1)

    def set_forward(self, slots: list[int], write_pos: torch.Tensor, read_len: int, real: torch.Tensor) -> None:
        """As `SlotCache.set_forward`; `real[b, j]` is False where query j of row b is padding (its keys go to
        the scratch block)."""
        device = self.keys[0].device
        for slot, pos, mask in zip(slots, write_pos, real, strict=True):
            self.reserve(slot, int(pos[mask].max()) + 1 if bool(mask.any()) else 0)
        width = -(-read_len // self.block)
        tables = torch.zeros((len(slots), width), dtype=torch.long)
        for b, slot in enumerate(slots):
            table = self.tables.get(slot, [])[:width]
            tables[b, : len(table)] = torch.tensor(table, dtype=torch.long)
        block = torch.where(real, tables.gather(1, (write_pos // self.block).clamp(max=width - 1)), 0)
        self.write_block, self.write_offset = block.to(device), (write_pos % self.block).to(device)
        self.read_index = tables.to(device)
        self.read_len = read_len

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[self.write_block, self.write_offset] = key_states.transpose(1, 2).to(keys.dtype)
        values[self.write_block, self.write_offset] = value_states.transpose(1, 2).to(values.dtype)
        return self._gather(keys), self._gather(values)

    def _gather(self, pool: torch.Tensor) -> torch.Tensor:
        rows, width = self.read_index.shape
        got = pool[self.read_index].view(rows, width * self.block, pool.shape[2], pool.shape[3])  # one copy
        return got[:, : self.read_len].transpose(1, 2)

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
    reserved: int = 0  # with a token budget: the positions its running turn may reach (prompt + max_new_tokens)


class ContinuousSampler:
    """A running batch over one model. `add(key, request)` queues a turn of episode `key`; `step()`
    advances every turn by one token and returns `(key, result)` of those that ended;
    `release(key)` ends the episode. Requests' `past` and `keep_cache` are ignored (the slot is the cache).

    Key-value memory: without `kv_cache_tokens`, a `SlotCache` (every slot the capacity of the longest
    row: slots × longest). With it, a `PagedCache` of at most that many tokens: a waiting turn starts
    (is prefilled) only when the blocks of its conversation plus its `max_new_tokens` fit beside the
    running turns'; to make room, the caches of episodes not running (waiting, or between turns) are
    dropped, oldest first, and their next turn runs their whole conversation again. Each row samples
    with its own generator, so which turns run together changes no token (up to float rounding of
    batched kernels). A turn that alone needs more than the budget is an `InputError`."""

    def __init__(self, model: torch.nn.Module, *, max_rows: int, pad_id: int = 0,
                 logprobs_mode: LogprobsMode = "raw_logprobs",
                 forward_kwargs: Callable[[list[Any]], dict[str, Any]] | None = None,
                 device: torch.device | str | None = None, min_shared_prefix: int = 32,
                 kv_cache_tokens: int | None = None):
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
        limit = int(getattr(inner.config, "max_position_embeddings", None) or 1 << 20)
        self.max_rows = max_rows
        self.cache: SlotCache | PagedCache = (SlotCache(max_rows, limit) if kv_cache_tokens is None
                                              else PagedCache(kv_cache_tokens, limit))
        self.cache.allocate(self.layers, self._probe_like())
        self.peak_allocated_tokens = self.cache.allocated_tokens
        self.rows: dict[Hashable, _Row] = {}
        self.by_slot: list[_Row] = []
        self.waiting: list[_Row] = []  # turns added, not prefilled yet
        self.running: list[_Row] = []  # turns generating
        self.done: list[_Row] = []  # turns with no token budget, returned by the next step
        self.prefixes: dict[Any, tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        self.min_shared_prefix = min_shared_prefix
        self.forwards = 0
        self.dropped = 0  # idle episodes' caches dropped to make room (their next turn runs all of it again)
        self.held_back = 0  # steps at which a waiting turn did not fit

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.done)

    def add(self, key: Hashable, request: GenerationRequest) -> None:
        if not request.prompt_ids:
            raise ValueError("empty prompt")
        row = self.rows.get(key)
        if row is None:
            if len(self.by_slot) >= self.max_rows:
                raise RuntimeError(f"all {self.max_rows} slots are taken")
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
        self.cache.free(row.slot)
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
                    ended += self._prefill(self._start_waiting())
                if self.running:
                    ended += self._decode()
        finally:
            if was_training:
                self.model.train()
        self.peak_allocated_tokens = max(self.peak_allocated_tokens, self.cache.allocated_tokens)
        out = []
        for row in ended:
            out.append((row.key, row.result))
            row.request = row.result = None
            row.reserved = 0
        return out

    # --- prefill --------------------------------------------------------------------------
    def _start_waiting(self) -> list[_Row]:
        """The waiting rows that start now (all of them, but where the token budget holds some back), each
        with its `new_ids`: its prompt past what its slot (or a shared prefix) holds."""
        fresh = [r for r in self.waiting if not r.cached]
        self._make_prefixes(fresh)
        starting = self._admit() if isinstance(self.cache, PagedCache) else self.waiting
        self.waiting = [r for r in self.waiting if r not in starting]
        for row in starting:
            ids = row.request.prompt_ids
            if not row.cached:
                prefix = self._prefix_for(row.request)
                if prefix is not None:
                    self.cache.write(row.slot, 0, prefix[1])
                    row.cached = list(prefix[0])
            keep = _common_prefix(row.cached, ids, limit=len(ids) - 1)  # at least one token to run
            row.cached = row.cached[:keep]
            row.new_ids = ids[keep:]
        return starting

    def _admit(self) -> list[_Row]:
        """The waiting rows, in order, whose turns fit the token budget beside the running ones (dropping the
        caches of rows not running, oldest first, to make room); the rest wait."""
        cache = self.cache
        assert isinstance(cache, PagedCache)
        blocks = lambda tokens: -(-tokens // cache.block)  # noqa: E731
        for row in self.running:
            row.reserved = max(row.reserved, len(row.cached) + 1)
        starting: list[_Row] = []
        for row in self.waiting:
            need = blocks(len(row.request.prompt_ids) + row.request.max_new_tokens)
            if need > cache.max_blocks:
                raise InputError(f"a turn needs {need * cache.block} tokens of key-value cache (its conversation and "
                                 f"max_new_tokens) but the budget is {cache.max_blocks * cache.block} (kv_cache_tokens)")
            active = set(map(id, self.running + starting))
            held = sum(max(len(cache.tables.get(r.slot, [])), blocks(r.reserved) if id(r) in active else 0)
                       for r in self.by_slot if r is not row)
            idle = [r for r in self.by_slot if id(r) not in active and r is not row and cache.tables.get(r.slot)]
            if held - sum(len(cache.tables[r.slot]) for r in idle) + need > cache.max_blocks:
                self.held_back += 1
                break  # even with every idle cache dropped: it and those after it wait for running turns to end
            while held + need > cache.max_blocks:
                victim = idle.pop(0)  # by slot: the longest-lived first
                held -= len(cache.tables[victim.slot])
                cache.free(victim.slot)
                victim.cached = []
                self.dropped += 1
            row.reserved = len(row.request.prompt_ids) + row.request.max_new_tokens
            starting.append(row)
        if not starting and not self.running and self.waiting:
            raise RuntimeError("no turn fits the key-value budget")  # unreachable: need ≤ max_blocks above
        return starting

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

    def _prefill(self, starting: list[_Row]) -> list[_Row]:
        rows = sorted(starting, key=lambda r: len(r.new_ids))
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
        real = torch.arange(width).unsqueeze(0) >= torch.tensor([width - len(r.new_ids) for r in rows]).unsqueeze(1)
        logits = self._forward(rows, input_ids, positions, write, read_len, slots, real)
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
        logits = self._forward(rows, input_ids, positions, positions, read_len, [r.slot for r in rows],
                               torch.ones_like(positions, dtype=torch.bool))
        for row in rows:
            row.cached.append(row.result.token_ids[-1])
        self.running = []
        return self._sample(rows, logits)

    # --- shared ---------------------------------------------------------------------------
    def _forward(self, rows, input_ids, positions, write, read_len, slots, real) -> torch.Tensor:
        device = self.device
        if isinstance(self.cache, PagedCache):
            self.cache.set_forward(slots, write, read_len, real)
        else:
            self.cache.set_forward(slots, write, read_len)
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
                         use_cache=True, **{self.cache_name: self.cache}, **kwargs)
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
                                        forward_kwargs=p.continuous_forward_kwargs(route),
                                        kv_cache_tokens=getattr(p, "kv_cache_tokens", None))
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
